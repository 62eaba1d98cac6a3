"""Loaders against the real files in ../shared/data (and small variants of them written in-test)."""

import json

import pytest

from bench_helpers import DATA_DIR, DEFAULT_DATA_DIR, ChatServer, judge_like_responder
from benchmarks.tasks.datasets import (
    DataError,
    default_data_dir,
    heuristic_subject,
    load_mmlu_subset,
    load_mquake_uns,
    load_unkebench,
)
from benchmarks.tasks.judge import ChatClient, JudgeSettings

pytestmark = pytest.mark.skipif(
    not DATA_DIR.is_dir(), reason="needs ../shared/data next to the repository"
)


def test_default_data_dir_is_shared_data_or_env(monkeypatch, tmp_path):
    monkeypatch.delenv("HPSE_DATA_DIR", raising=False)
    assert default_data_dir().resolve() == DEFAULT_DATA_DIR.resolve()
    monkeypatch.setenv("HPSE_DATA_DIR", str(tmp_path))
    assert default_data_dir() == tmp_path


def test_unkebench_v2_with_subject_file(tmp_path):
    ds = load_unkebench(DATA_DIR, cache_dir=tmp_path)
    assert len(ds) == 800
    first = ds[0]
    assert (
        first["case_id"] == "0"
        and first["subject"] == "George Rankin"
        and first["subject_source"] == "file"
    )
    assert first["requests"] == [
        {
            "prompt": "Introduce George Rankin.",
            "subject": "George Rankin",
            "target_new": first["passage"],
        }
    ]
    assert first["question"] == "What is George Rankin's occupation?"
    assert first["para_question"] == "What does George Rankin do for a living?"
    assert first["passage"].startswith(
        "George Rankin has been actively involved in politics for over a decade."
    )
    assert first["sub_questions"][0] == "How long has George Rankin been involved in politics?"
    assert len(first["sub_questions"]) == len(first["sub_answers"])
    assert (
        {4, 5, 6, 7} <= {len(q) for q in ds["sub_questions"]} <= {4, 5, 6, 7, 8}
    )  # SOURCES.md: 4-8 each
    assert set(ds["subject_source"]) == {"file"}
    assert "mmlu_questions" not in ds.column_names
    assert len(load_unkebench(DATA_DIR, limit=3, cache_dir=tmp_path)) == 3


def _v3_file(tmp_path, n=4):
    records = json.loads((DATA_DIR / "unkebench" / "final_data_v2.json").read_text())[:n]
    for r in records:
        r["mmlu_questions"] = ["Q1?", "Q2?"]
        r["mmlu_choices"] = [["a", "b", "c", "d"], ["e", "f", "g", "h"]]
        r["mmlu_answer"] = [2, 0]
    path = tmp_path / "final_data_v3.json"
    path.write_text(json.dumps(records))
    return path, records


def test_unkebench_v3_schema_keeps_mmlu_fields(tmp_path):
    path, records = _v3_file(tmp_path)
    ds = load_unkebench(DATA_DIR, file=path, cache_dir=tmp_path)
    assert len(ds) == 4 and ds[1]["mmlu_choices"] == [["a", "b", "c", "d"], ["e", "f", "g", "h"]]
    assert ds[1]["mmlu_answer"] == [2, 0] and ds[1]["passage"] == records[1]["answer"]


def test_unkebench_bad_schema_names_file_record_and_field(tmp_path):
    path, records = _v3_file(tmp_path)
    del records[2]["sub_answer"]
    path.write_text(json.dumps(records))
    with pytest.raises(
        DataError, match=r"final_data_v3.json: record #2 \(id 2\) has no field 'sub_answer'"
    ):
        load_unkebench(DATA_DIR, file=path, cache_dir=tmp_path)
    with pytest.raises(DataError, match="no such file.*--data"):
        load_unkebench(tmp_path, cache_dir=tmp_path)


def test_unkebench_missing_subjects_heuristic_fallback_is_logged(tmp_path, caplog):
    subjects = tmp_path / "subjects.json"
    subjects.write_text(json.dumps({"0": "George Rankin"}))  # only the first record has a subject
    ds = load_unkebench(DATA_DIR, limit=3, subjects_file=subjects, cache_dir=tmp_path)
    assert ds["subject_source"] == ["file", "heuristic", "heuristic"]
    assert ds["subject"] == ["George Rankin", "John Mayne", "Henry Feilden"]
    assert "HEURISTIC SUBJECT FALLBACK for 2" in caplog.text
    with pytest.raises(DataError, match="no subject for 2 record"):
        load_unkebench(
            DATA_DIR, limit=3, subjects="file", subjects_file=subjects, cache_dir=tmp_path
        )


def test_heuristic_subject_agrees_with_the_written_subjects_mostly():
    records = json.loads((DATA_DIR / "unkebench" / "final_data_v2.json").read_text())
    written = json.loads((DATA_DIR / "unkebench" / "subjects.json").read_text())
    agree = sum(
        heuristic_subject(r["question"], r["answer"]) == written[str(r["id"])] for r in records
    )
    assert agree / len(records) > 0.75  # measured: 651 of 800
    assert (
        heuristic_subject("What is Jim Brown's role at The Cheesecake Factory?", "") == "Jim Brown"
    )


def _cached_client(server, tmp_path, model):
    """A client with the one response cache the runner gives it
    (``<cache-dir>/judge_cache.sqlite``)."""
    return ChatClient(
        JudgeSettings(
            base_url=server.url, model=model, cache_path=str(tmp_path / "judge_cache.sqlite")
        )
    )


@pytest.mark.slow
def test_unkebench_subjects_generated_by_the_endpoint_are_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    with ChatServer(judge_like_responder) as server:
        client = _cached_client(server, tmp_path, "subj/model")
        ds = load_unkebench(DATA_DIR, limit=2, subjects="llm", client=client, cache_dir=tmp_path)
        assert (
            ds["subject"] == ["Generated Topic"] * 2
            and ds["subject_source"] == ["llm:subj/model"] * 2
        )
        assert ds[0]["requests"][0]["prompt"] == "Introduce Generated Topic."
        assert (
            len(server.prompts) == 2
            and "George Rankin has been actively involved" in server.prompts[0]
        )
        client.close()
        again = _cached_client(
            server, tmp_path, "subj/model"
        )  # a new process: the answers come from the cache
        assert (
            load_unkebench(DATA_DIR, limit=2, subjects="llm", client=again, cache_dir=tmp_path)[
                "subject"
            ]
            == ds["subject"]
        )
        assert len(server.prompts) == 2 and again.stats["cache_hits"] == 2
        assert not list(tmp_path.glob("*.json"))  # no second cache beside the client's


def test_a_subjects_file_of_the_old_json_cache_is_still_used_and_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    old = tmp_path / "unkebench_subjects.subj_model.json"
    old.write_text(json.dumps({"0": "Old Topic"}))
    with ChatServer(judge_like_responder) as server:
        client = _cached_client(server, tmp_path, "subj/model")
        ds = load_unkebench(DATA_DIR, limit=2, subjects="llm", client=client, cache_dir=tmp_path)
        assert ds["subject"] == ["Old Topic", "Generated Topic"] and len(server.prompts) == 1
    assert json.loads(old.read_text()) == {"0": "Old Topic"}


def test_mquake_uns_from_akew(tmp_path):
    ds = load_mquake_uns(DATA_DIR, cache_dir=tmp_path)
    raw = json.loads((DATA_DIR / "akew" / "MQuAKE-CF.json").read_text())
    assert len(ds) == 254 == len(raw)
    c = ds[0]
    assert c["case_id"] == "1"
    assert c["requests"] == [
        {
            "prompt": "Introduce Ellie Kemper.",
            "subject": "Ellie Kemper",
            "target_new": raw[0]["requested_rewrite"][0]["fact_new_uns"],
        }
    ]
    assert c["single_hop_questions"] == [h["question"] for h in raw[0]["new_single_hops"]]
    assert c["single_hop_answers"][0] == [
        "Croatia",
        "CRO",
        "RH",
        "HRV",
        "HR",
        "Republic of Croatia",
    ]
    assert c["multi_hop_questions"] == raw[0]["questions"] and len(c["multi_hop_questions"]) == 3
    assert c["multi_hop_answers"] == ["Kolinda Grabar-Kitarović", "Grabar-Kitarović"]
    assert [len(r) for r in ds["requests"]] == [
        len(x["requested_rewrite"]) for x in raw
    ]  # all rewrites in one edit
    assert set(ds["passage_source"]) == {"fact_new_uns"}


def _cf3k_file(tmp_path, n=3):
    """The same cases in the MQuAKE-CF-3k schema: no AKEW fields in the rewrites."""
    cases = json.loads((DATA_DIR / "akew" / "MQuAKE-CF.json").read_text())[:n]
    for c in cases:
        for rw in c["requested_rewrite"]:
            for key in ("fact_new", "fact_new_uns", "verify_unsfact_GPT", "unsfact_triplets_GPT"):
                rw.pop(key)
    path = tmp_path / "MQuAKE-CF-3k.json"
    path.write_text(json.dumps(cases))
    return path, cases


def test_mquake_cf3k_schema_gets_generated_passages_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    path, cases = _cf3k_file(tmp_path)
    with pytest.raises(DataError, match="no 'fact_new_uns' passage; configure a judge endpoint"):
        load_mquake_uns(DATA_DIR, file=path, cache_dir=tmp_path)
    with ChatServer(judge_like_responder) as server:
        client = _cached_client(server, tmp_path, "gen")
        ds = load_mquake_uns(DATA_DIR, file=path, client=client, cache_dir=tmp_path)
        n_rewrites = sum(len(c["requested_rewrite"]) for c in cases)
        assert len(server.prompts) == n_rewrites
        assert (
            "FACT: Ellie Kemper is a citizen of Croatia." in server.prompts[0]
        )  # fact_new rebuilt from prompt + target
        assert ds[0]["requests"][0]["target_new"] == "A generated passage stating the fact."
        assert set(ds["passage_source"]) == {"llm:gen"}
        load_mquake_uns(DATA_DIR, file=path, client=client, cache_dir=tmp_path)
        assert len(server.prompts) == n_rewrites  # cached in the client's judge_cache.sqlite
    assert (tmp_path / "judge_cache.sqlite").is_file() and not (
        tmp_path / "mquake_passages.gen.json"
    ).exists()


def _mquake_variant(tmp_path, edit):
    cases = json.loads((DATA_DIR / "akew" / "MQuAKE-CF.json").read_text())[:3]
    edit(cases)
    path = tmp_path / "MQuAKE-bad.json"
    path.write_text(json.dumps(cases, ensure_ascii=False), encoding="utf-8")
    return path


def test_a_repeated_case_id_is_one_line_before_anything_is_edited(tmp_path, monkeypatch, caplog):
    """The loader refuses it; the runner says it in one line before the model loads (it used to edit
    the first copy, then fail with a ValueError when recording the second)."""
    from benchmarks.run.case_loop import Editing
    from benchmarks.run.cli import cli_main
    from tiny_models import make_tiny_model_and_tokenizer

    def repeat(cases):
        cases[2]["case_id"] = cases[0]["case_id"]

    path = _mquake_variant(tmp_path, repeat)
    with pytest.raises(DataError, match=r"case #2 \(case_id 1\) repeats a case_id"):
        load_mquake_uns(DATA_DIR, file=path, cache_dir=tmp_path)
    make_tiny_model_and_tokenizer("llama", tmp_path=tmp_path / "model")
    (tmp_path / "hp.yaml").write_text(f"alg_name: HPSE\nmodel_name: {tmp_path / 'model'}\n")
    loaded = []
    monkeypatch.setattr(Editing, "ensure_model", lambda self: loaded.append(1))
    code = cli_main(
        "mquake-uns",
        [
            "--hparams",
            str(tmp_path / "hp.yaml"),
            "--data",
            str(DATA_DIR),
            "--mquake-file",
            str(path),
            "--out",
            str(tmp_path / "run"),
            "--log-level",
            "ERROR",
            "--judge",
            "lexical",
        ],
    )
    said = [r.getMessage() for r in caplog.records if getattr(r, "hpse_one_line", None)]
    assert code == 2 and len(said) == 1 and "repeats a case_id" in said[0] and not loaded


def test_a_latin1_data_file_names_the_file_and_its_encoding(tmp_path):
    def accent(cases):
        cases[0]["requested_rewrite"][0]["subject"] = "Ellie Kémper"

    path = _mquake_variant(tmp_path, accent)
    path.write_bytes(path.read_text(encoding="utf-8").encode("latin-1", errors="replace"))
    with pytest.raises(DataError, match=r"MQuAKE-bad.json: not UTF-8 \(it looks like") as info:
        load_mquake_uns(DATA_DIR, file=path, cache_dir=tmp_path)
    assert "iconv" in str(info.value) and "\n" not in str(info.value)


def test_mmlu_subset_is_fixed_stratified_and_has_same_subject_dev_shots():
    items = load_mmlu_subset(DATA_DIR, 120, shots=5, seed=0)
    assert len(items) == 120
    assert len({it.subject for it in items}) == 57  # round-robin over all subjects first
    assert items == load_mmlu_subset(DATA_DIR, 120, shots=5, seed=0)
    assert items != load_mmlu_subset(DATA_DIR, 120, shots=5, seed=1)
    for it in items:
        assert len(it.shots) == 5 and 0 <= it.answer < 4 and len(it.choices) == 4
    algebra = [
        it
        for it in load_mmlu_subset(DATA_DIR, 57 * 100, shots=0)
        if it.subject == "abstract_algebra"
    ]
    assert len(algebra) == 100
    degree = [
        it
        for it in algebra
        if it.question.startswith("Find the degree for the given field extension Q(sqrt(2)")
    ]
    assert degree[0].choices == ("0", "4", "2", "6") and degree[0].answer == 1  # "B"
    assert len(load_mmlu_subset(DATA_DIR, 20000, shots=0)) == 14042
