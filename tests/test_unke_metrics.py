"""benchmarks/tasks/unke_scores.py and unke_metrics.py: UnKE's own BLEU and ROUGE (EasyEdit's
eval_akew_unstructured).

Hand-made strings check the two libraries' conventions the module keeps (character BLEU, set-based
ROUGE recall, EasyEdit's space padding); the agreement test runs EasyEdit's own function on the
stored answers of a committed run when EasyEdit is importable (``EASYEDIT_SRC``).
"""

import json
import shutil
from pathlib import Path

import pytest
import torch

from benchmarks.analysis import unke_metrics as M
from benchmarks.analysis.paired import load_cases
from benchmarks.analysis.study import find_blocks, generate
from benchmarks.tasks import TASKS
from benchmarks.tasks import unke_scores as U
from benchmarks.tasks.judge import LexicalJudge

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "docs" / "study" / "compare-unkebench" / "UnKE"  # 20 stored UnKEBench records


class CharCounts:
    """A stand-in sentence encoder: counts of 'a', 'e' and ' ' (hand-checkable cosines)."""

    def encode(self, sentences, convert_to_tensor=True, **_):
        counts = [[s.count("a"), s.count("e"), s.count(" ")] for s in sentences]
        return torch.tensor(counts, dtype=torch.float)


def test_bleu_is_nltk_on_characters():
    # characters of 'abcdxf' against 'abcdef': 1-grams 5/6, 2-grams 3/5, 3-grams 2/4, 4-grams 1/3;
    # same length, so no brevity penalty
    expected = (5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25
    assert U.bleu("abcdef", "abcdxf") == pytest.approx(expected, rel=1e-12)
    # word order does not matter much to character n-grams: word BLEU-4 of these would be 0
    assert U.bleu("red fox jumps", "fox red jumps") > 0.5


def test_rouge_recall_is_the_rouge_package_with_sets_and_case():
    r = U.rouge_recall("the cat sat on the mat", "the cat sat")
    # n-grams are counted once each: 3 of the 5 distinct words, 2 of the 5 distinct bigrams; the
    # LCS (3) over the 5 distinct reference words
    assert r == pytest.approx({"ROUGE-1": 0.6, "ROUGE-2": 0.4, "ROUGE-L": 0.6})
    assert U.rouge_recall("the cat", "The cat")["ROUGE-1"] == pytest.approx(0.5)  # case-sensitive


def test_rouge_recall_equals_the_rouge_packages_on_every_path_of_the_lcs():
    """ROUGE-L is computed here, not by the package (its dict-keyed LCS tables cost most of
    RESULTS.md's regeneration): on texts from a four-word vocabulary, where LCS ties and repeated
    words are the rule, and on several sentences each, all three recalls are the package's to the
    last bit."""
    import random

    from rouge import Rouge

    package = Rouge()
    rng = random.Random(0)
    words = ["a", "b", "c", "d"]

    def text() -> str:
        sentences = [
            " ".join(rng.choice(words) for _ in range(rng.randint(1, 12)))
            for _ in range(rng.randint(1, 3))
        ]
        return ". ".join(sentences) + rng.choice(["", ".", " .", "  "])

    pairs = [(text(), text()) for _ in range(400)]
    pairs += [("the cat sat on the mat. The dog ran", "the mat sat. cat the  dog ran on")]
    for reference, prediction in pairs:
        want = package.get_scores(prediction, reference)[0]
        got = U.rouge_recall(reference, prediction)
        assert got == {m: want[m.lower()]["r"] for m in U.ROUGE}, (reference, prediction)


def test_case_metrics_pads_like_easyedit_and_averages_sub_answers():
    passage = "Ada was born in Paris. She studied physics."
    answers = {
        "question": "Paris",
        "para_question": "",
        "sub_questions": ["Paris.", "physics and art"],
    }
    m = U.case_metrics(passage, ["Paris", "physics"], answers)
    # a one-word answer is scored with a space appended; an empty one becomes " " (rouge rejects "")
    padded = "Paris "
    assert m["Original"] == {
        "BLEU SCORE": U.bleu(passage, padded),
        **U.rouge_recall(passage, padded),
    }
    assert U.bleu(passage, padded) != U.bleu(passage, "Paris")
    assert m["Para"]["ROUGE-1"] == 0.0 and "Bert Score" not in m["Para"]
    assert m["Sub"]["ROUGE-1"] == pytest.approx((1.0 + 1.0) / 2)
    assert m["Sub"]["ROUGE-2"] == pytest.approx(0.0)  # one-word gold sub-answers have no bigram


def test_cosine_and_summary_in_percent_with_the_missing_bert_score_explained():
    passage = "a a e"
    answers = {"question": "a e", "para_question": "e e", "sub_questions": ["x y"]}
    m = U.case_metrics(passage, ["x y"], answers, encoder=CharCounts())
    # (2, 1, 2) against (1, 1, 1) and (0, 2, 1)
    assert m["Original"]["Bert Score"] == pytest.approx(5 / (3 * 3**0.5))
    assert m["Para"]["Bert Score"] == pytest.approx(4 / (3 * 5**0.5))
    s = U.summarize_metrics([m, m])
    assert s["n_cases"] == 2
    assert s["Original"]["Bert Score"] == pytest.approx(100 * 5 / (3 * 3**0.5))
    assert "not_computed" not in s and s["Sub"] == {k: pytest.approx(100.0) for k in U.ROUGE}
    why = {"Bert Score": "no model here"}
    plain = {**U.case_metrics(passage, ["x y"], answers), "not_computed": why}
    s = U.summarize_metrics([m, plain])
    assert "Bert Score" not in s["Original"] and s["not_computed"] == why
    assert "Bert Score" in M.metrics_table([("run", s)]).splitlines()[-1]


def test_load_encoder_says_why_without_sentence_transformers(monkeypatch):
    import sys

    U.load_encoder.cache_clear()
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # import fails
    try:
        assert U.load_encoder() == (None, "sentence-transformers is not installed")
    finally:
        U.load_encoder.cache_clear()


def test_unkebench_records_and_summary_gain_the_metrics_and_keep_every_other_key(monkeypatch):
    monkeypatch.setattr(U, "load_encoder", lambda name=U.MINILM: (None, "no model here"))
    task = TASKS["unkebench"]
    case = {
        "passage": "Ada was born in Paris. She studied physics.",
        "subject": "Ada",
        "sub_questions": ["Where was Ada born?", "What did Ada study?"],
        "sub_answers": ["Paris", "physics"],
    }
    answers = ["Ada was born in Paris.", "Paris.", "In Paris.", "She studied physics."]
    rec = task.score(case, answers, LexicalJudge())
    stored = rec["answers"]
    assert rec[U.KEY] == {
        **U.case_metrics(case["passage"], case["sub_answers"], stored),
        "not_computed": {"Bert Score": "no model here"},
    }
    old = {k: v for k, v in rec.items() if k != U.KEY}  # a record from before the metrics existed
    before = task.summarize([old, old])
    after = task.summarize([rec, rec])
    assert U.KEY not in before and {k: v for k, v in after.items() if k != U.KEY} == before
    assert after[U.KEY] == U.summarize_metrics([rec[U.KEY]] * 2)
    assert after[U.KEY]["not_computed"] == {"Bert Score": "no model here"}


@pytest.mark.slow
def test_write_adds_one_key_to_summary_and_a_section_to_table(tmp_path, data_dir, capsys):
    run = tmp_path / "study" / "UnKE"
    shutil.copytree(RUN, run)
    (run / "table.md").write_text("| a table |\n")
    results_before = {p.name: p.read_bytes() for p in run.glob("results*.jsonl")}
    # the run as it was committed before --write added the metrics
    summary_before = json.loads((run / "summary.json").read_text())
    summary_before.pop(U.KEY, None)
    (run / "summary.json").write_text(json.dumps(summary_before))
    for _ in range(2):  # twice: still one section in table.md
        assert M.main([str(tmp_path / "study"), "--write", "--data", str(data_dir)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert {k: v for k, v in summary.items() if k != U.KEY} == summary_before
    assert summary[U.KEY]["n_cases"] == summary_before["n_cases"] == 20
    assert {p.name: p.read_bytes() for p in run.glob("results*.jsonl")} == results_before
    table = (run / "table.md").read_text()
    assert table.startswith("| a table |\n") and table.count("UnKE's own metrics") == 1
    assert f"{summary[U.KEY]['Original']['ROUGE-L']:.1f}" in table
    capsys.readouterr()
    # the study tool prints the same numbers from the stored answers
    blocks = find_blocks("<!-- study: unke UnKE --label UnKE -->\n<!-- /study -->\n")
    row = generate(blocks, tmp_path / "study", data=str(data_dir))[0].splitlines()[2]
    assert row.startswith("| UnKE | 20 | 200 | ")
    assert row.endswith(f" {summary[U.KEY]['Sub']['ROUGE-L']:.1f} |")


def test_agrees_with_easyedits_eval_akew_unstructured(he, data_dir, tmp_path, monkeypatch):
    """EasyEdit's own function on the stored answers of a committed run, in its input format; its
    MiniLM is not on this machine, so both sides embed with the same stand-in encoder."""
    from easyeditor.evaluate import evaluate_uns

    from benchmarks.analysis.paired import load_cases, load_run

    cases = load_cases("unkebench", data_dir, "the test")
    _, recs = load_run(RUN)
    data = [
        {
            "answer": cases[c]["passage"],
            "sub_answer": list(cases[c]["sub_answers"]),
            "original_prediction": r["answers"]["question"],
            "para_prediction": r["answers"]["para_question"],
            "sub_pred": list(r["answers"]["sub_questions"]),
        }
        for c, r in sorted(recs.items(), key=lambda kv: kv[1]["index"])
    ]
    path = tmp_path / "predictions.json"
    path.write_text(json.dumps(data))
    monkeypatch.setattr(evaluate_uns, "SentenceTransformer", lambda *a, **k: CharCounts())
    theirs = evaluate_uns.eval_akew_unstructured(
        str(path), "unke", model_path="stand-in", device="cpu"
    )
    ours = M.run_metrics(RUN, cases, encoder=CharCounts())
    assert ours["n_cases"] == len(data) == 20
    for group in ("Original", "Para", "Sub"):
        assert set(theirs[group]) == set(ours[group])
        for name, value in theirs[group].items():
            tol = 1e-6 if name == "Bert Score" else 1e-12  # float32 embeddings; else the same sums
            assert ours[group][name] == pytest.approx(100 * value, rel=tol), (group, name)


@pytest.mark.slow
def test_write_covers_each_checkpoint_and_dir_at_n_prints_one(tmp_path, data_dir, capsys):
    study = tmp_path / "study"
    run = study / "seq"
    shutil.copytree(RUN, run)
    records = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    # the first ten records again, as a --checkpoints run holds them after 10 edits
    with open(run / "checkpoints.jsonl", "w") as fh:
        for rec in records[:10]:
            fh.write(json.dumps({**rec, "checkpoint": 10}) + "\n")
    summary = json.loads((run / "summary.json").read_text())
    summary.pop(U.KEY, None)
    summary["checkpoints"] = {"10": {"n_cases": 10}}
    (run / "summary.json").write_text(json.dumps(summary))
    unfinished = study / "unfinished"
    shutil.copytree(RUN, unfinished)
    (unfinished / "summary.json").unlink()
    assert M.main([str(study), "--write", "--data", str(data_dir)]) == 0
    assert "added unke_metrics to 1 UnKEBench run(s)" in capsys.readouterr().out
    written = json.loads((run / "summary.json").read_text())
    at10 = written["checkpoints"]["10"][U.KEY]
    assert at10["n_cases"] == 10 and written[U.KEY]["n_cases"] == 20
    alone = M.run_metrics(f"{run}@10", load_cases("unkebench", data_dir, "test"))
    assert {k: v for k, v in at10.items() if k != "not_computed"} == {
        k: v for k, v in alone.items() if k != "not_computed"
    }
    assert f"{summary['label']} after 10 edits" in (run / "table.md").read_text()
    assert not (unfinished / "summary.json").exists()  # skipped, not written
    # DIR@N prints that checkpoint's row; --write refuses it, and a named unfinished run
    assert M.main([f"{run}@10", "--label", "at 10", "--data", str(data_dir)]) == 0
    row = capsys.readouterr().out.splitlines()[2]
    assert row.startswith("| at 10 | 10 | 200 | ")
    assert row.endswith(f" {at10['Sub']['ROUGE-L']:.1f} |")
    assert M.main([f"{run}@10", "--write", "--data", str(data_dir)]) == 2
    assert "give the run directory" in capsys.readouterr().err
    assert M.main([str(unfinished), "--write", "--data", str(data_dir)]) == 2
    assert "has not finished" in capsys.readouterr().err
