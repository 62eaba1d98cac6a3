"""hpse_easyedit.data_files: the data directory rule, the layout and the one MMLU CSV reader (no
benchmark data needed)."""

import pytest

import benchmarks.tasks.datasets as bench_datasets
import benchmarks.tasks.paths as bench_paths
import hpse_easyedit.integrations.covariance as cov
from hpse_easyedit import data_files as df


def test_data_dir_is_env_else_shared_data_next_to_the_repository(monkeypatch, tmp_path):
    monkeypatch.delenv("HPSE_DATA_DIR", raising=False)
    assert df.data_dir() == df.Path(df.__file__).resolve().parents[2] / "shared" / "data"
    monkeypatch.setenv("HPSE_DATA_DIR", str(tmp_path))
    assert df.data_dir() == tmp_path == bench_paths.default_data_dir()


def test_the_layout_and_the_error_are_the_core_ones_everywhere():
    assert cov.data_dir is df.data_dir
    assert bench_datasets.DataError is df.DataError
    assert (bench_datasets.UNKE_FILE, bench_datasets.MQUAKE_FILE) == (df.UNKE_FILE, df.MQUAKE_FILE)


def _mmlu(tmp_path, rows, subject="algebra", split="test"):
    path = df.mmlu_file(tmp_path, split, subject)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(r + "\n" for r in rows), encoding="utf-8")
    return path


def test_read_mmlu_csv_rows_and_one_line_error(tmp_path):
    path = _mmlu(tmp_path, ['"What is 1+1, really?",1,2,3,4,B', "Q2,a,b,c,d,D"])
    assert df.read_mmlu_csv(path) == [
        ("What is 1+1, really?", ("1", "2", "3", "4"), 1),
        ("Q2", ("a", "b", "c", "d"), 3),
    ]
    assert df.mmlu_test_files(tmp_path) == [path]
    assert df.mmlu_text("Q2", ("a", "b", "c", "d")) == "Q2\nA. a\nB. b\nC. c\nD. d"
    for bad in ("Q,a,b,c,d,E", "Q,a,b,c,d,", "Q,a,b,c,d,AB", "Q,a,b,c,A"):
        bad_path = _mmlu(tmp_path, ["Q1,a,b,c,d,A", bad], subject="bad")
        with pytest.raises(
            df.DataError,
            match=r"bad_test.csv: row 2 must have 6 fields 'question,A,B,C,D,answer\(A-D\)', "
            r"got \['Q'\]\.\.\.$",
        ):
            df.read_mmlu_csv(bad_path)


def test_builtin_mmlu_corpus_and_subset_read_the_same_files(tmp_path):
    _mmlu(tmp_path, ["Q1,a,b,c,d,A", "Q2,e,f,g,h,C"])
    _mmlu(tmp_path, ["S1,a,b,c,d,B"] * 5, split="dev")
    assert cov.load_corpus("mmlu", tmp_path) == [
        "Q1\nA. a\nB. b\nC. c\nD. d",
        "Q2\nA. e\nB. f\nC. g\nD. h",
    ]
    items = bench_datasets.load_mmlu_subset(tmp_path, n=5, shots=2)
    assert sorted((it.question, it.answer) for it in items) == [("Q1", 0), ("Q2", 2)]
    assert items[0].shots == (("S1", ("a", "b", "c", "d"), 1),) * 2
