"""Atomic replacement of the files the project writes: each writer has its own temporary name."""

import json
import threading

import pytest

from benchmarks.records.store import ResultFile, write_json_atomic
from hpse_easyedit.atomic import replacing, writer_tmp


def test_two_writers_of_one_json_file_at_once_do_not_collide(tmp_path, another_writer_first):
    """With one shared ``.tmp`` name the second writer renamed the first one's file away
    (FileNotFoundError)."""
    path = tmp_path / "summary.json"
    done = another_writer_first(lambda: write_json_atomic(path, {"writer": "b"}))
    write_json_atomic(path, {"writer": "a"})
    assert done
    assert json.loads(path.read_text()) == {"writer": "a"}  # whole: the last one renamed
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_two_rewrites_of_one_results_file_at_once_do_not_collide(tmp_path, another_writer_first):
    path = tmp_path / "results.jsonl"
    ResultFile(path).append([{"case_id": "a", "Ind": 0.0}])
    other = ResultFile(path)
    done = another_writer_first(lambda: other.replace([{"case_id": "a", "Ind": 0.5}]))
    ResultFile(path).replace([{"case_id": "a", "Ind": 1.0}])
    assert done
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"case_id": "a", "Ind": 1.0}
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["results.jsonl"]


def test_a_failed_write_leaves_the_target_and_no_temporary_file(tmp_path):
    path = tmp_path / "report.html"
    path.write_text("the user's report")
    with pytest.raises(RuntimeError, match="disk full"):
        with replacing(path) as tmp:
            tmp.write_text("half a rep")
            raise RuntimeError("disk full")
    assert path.read_text() == "the user's report"
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]


def test_temporary_names_differ_between_threads_and_keep_the_suffix(tmp_path):
    path = tmp_path / "stats.npz"
    names = []
    thread = threading.Thread(target=lambda: names.append(writer_tmp(path, ".tmp.npz")))
    thread.start()
    thread.join()
    mine = writer_tmp(path, ".tmp.npz")
    assert mine != names[0] and mine.parent == path.parent
    assert mine.name.startswith("stats.npz.") and mine.name.endswith(".tmp.npz")
