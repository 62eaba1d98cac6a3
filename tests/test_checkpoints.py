"""Continual editing with checkpoints: the sequence evaluated part-way, and a sequence stopped in
the middle resumed from its snapshot or by replaying its recorded edits, ending with the
uninterrupted run's records."""

import json
import logging
from pathlib import Path

import pytest

from bench_helpers import DATA_DIR, isolate_judge_env
from benchmarks.records.sequence import STATE_DIR, checkpoint_records
from benchmarks.records.store import ConfigMismatchError
from benchmarks.run.case_loop import Editing
from benchmarks.run.runner import RunOptions, run_benchmark

pytestmark = pytest.mark.skipif(
    not DATA_DIR.is_dir(), reason="needs ../shared/data next to the repository"
)

TINY = """alg_name: HPSE
model_name: {model}
rounds: 1
inner_steps: 2
max_new_tokens: 4
lr: 1.0e-2
"""


@pytest.fixture(scope="module")
def tiny_files(tiny_model):
    return {
        "hpse.yaml": TINY.format(model=tiny_model),
        "ftm.yaml": TINY.format(model=tiny_model) + "executor: ft_m\nftm_layer: 1\n",
    }


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path):
    isolate_judge_env(monkeypatch, tmp_path)


def _opts(tiny, out, hparams="hpse.yaml", **kw):
    base = dict(
        benchmark="mquake-uns",
        hparams=str(tiny / hparams),
        data_dir=str(DATA_DIR),
        out_dir=str(out),
        limit=4,
        sequential=4,
        checkpoints=[1, 3],
        max_new_tokens=5,
        batch_size=4,
        judge="lexical",
    )
    base.update(kw)
    return RunOptions(**base)


def _untimed(path: Path) -> list[dict]:
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if "seconds" not in k}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return [strip(json.loads(line)) for line in path.read_text().splitlines()]


def _text(path: Path) -> str:
    return path.read_text() if path.is_file() else ""


def _stop_after(monkeypatch, n_edits):
    """The run stops (as a Ctrl-C would) when it starts edit number ``n_edits + 1``."""
    real, calls = Editing.edit, [0]

    def edit(self, model, case):
        calls[0] += 1
        if calls[0] > n_edits:
            raise KeyboardInterrupt
        return real(self, model, case)

    monkeypatch.setattr(Editing, "edit", edit)
    return calls


def _stopped_run(monkeypatch, opts, n_edits):
    """``run_benchmark(opts)`` stopped (as a Ctrl-C would) when it starts edit ``n_edits + 1``."""
    _stop_after(monkeypatch, n_edits)
    with pytest.raises(KeyboardInterrupt):
        run_benchmark(opts)
    monkeypatch.undo()


@pytest.fixture(scope="module")
def reference(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "run"
    summary = run_benchmark(_opts(tiny, out))
    return out, summary


@pytest.mark.slow
def test_checkpoints_evaluate_the_cases_edited_so_far(reference):
    out, summary = reference
    by_checkpoint = checkpoint_records(out)
    assert sorted(by_checkpoint) == [1, 3]
    assert len(by_checkpoint[1]) == 1 and len(by_checkpoint[3]) == 3
    ids = [r["case_id"] for r in _untimed(out / "results.jsonl")]
    assert sorted(by_checkpoint[3]) == sorted(ids[:3])
    assert set(summary["checkpoints"]) == {"1", "3"} and summary["checkpoints"]["3"]["n_cases"] == 3
    assert summary["n_cases"] == 4
    assert json.loads((out / "config.json").read_text())["checkpoints"] == [1, 3]
    assert "after 3 edits" in (out / "table.md").read_text()
    assert not _text(out / "sequence.jsonl") and not list((out / STATE_DIR).glob("*"))


@pytest.mark.slow
@pytest.mark.parametrize("drop_snapshot", [False, True], ids=["from-snapshot", "by-replay"])
def test_a_sequence_stopped_midway_resumes_to_the_uninterrupted_records(
    tiny, tmp_path, monkeypatch, reference, drop_snapshot, caplog
):
    ref_out, ref_summary = reference
    out = tmp_path / "run"
    _stop_after(
        monkeypatch, 3
    )  # edits 1-3 made, the checkpoint after 3 evaluated, stopped at the 4th
    with pytest.raises(KeyboardInterrupt):
        run_benchmark(_opts(tiny, out))
    assert not _text(out / "results.jsonl")
    assert len((out / "sequence.jsonl").read_text().splitlines()) == 3
    assert sorted(checkpoint_records(out)) == [1, 3]
    if drop_snapshot:  # e.g. a new machine: the weights were not kept, the edits are replayed
        for p in (out / STATE_DIR).iterdir():
            p.unlink()
    monkeypatch.undo()
    isolate_judge_env(monkeypatch, tmp_path)
    with caplog.at_level(logging.INFO, logger="benchmarks.run.case_loop"):
        summary = run_benchmark(_opts(tiny, out))
    assert ("replaying 3 recorded edit(s)" in caplog.text) == drop_snapshot
    assert ("resuming after edit 3" in caplog.text) != drop_snapshot
    assert _untimed(out / "results.jsonl") == _untimed(ref_out / "results.jsonl")
    assert _untimed(out / "checkpoints.jsonl") == _untimed(ref_out / "checkpoints.jsonl")
    assert summary["checkpoints"] == ref_summary["checkpoints"]
    assert not _text(out / "sequence.jsonl") and not list((out / STATE_DIR).glob("*"))


@pytest.mark.slow
def test_a_replay_stopped_part_way_resumes_after_its_last_replayed_edit(
    tiny, tmp_path, monkeypatch, reference, caplog
):
    ref_out, _ = reference
    out = tmp_path / "run"
    _stopped_run(monkeypatch, _opts(tiny, out), 2)
    for p in (out / STATE_DIR).iterdir():  # no snapshot: the two edits are replayed
        p.unlink()
    _stopped_run(monkeypatch, _opts(tiny, out), 1)  # stopped while replaying the second
    isolate_judge_env(monkeypatch, tmp_path)
    assert len((out / "sequence.jsonl").read_text().splitlines()) == 2
    with caplog.at_level(logging.INFO, logger="benchmarks.run.case_loop"):
        run_benchmark(_opts(tiny, out))
    assert "resuming after edit 1 of 4" in caplog.text
    assert "replaying 1 recorded edit(s) (2 to 2)" in caplog.text
    assert "computes other values" not in caplog.text
    assert _untimed(out / "results.jsonl") == _untimed(ref_out / "results.jsonl")
    assert _untimed(out / "checkpoints.jsonl") == _untimed(ref_out / "checkpoints.jsonl")


@pytest.mark.slow
def test_a_replayed_edit_that_differs_redoes_the_block_from_there(
    tiny, tmp_path, monkeypatch, reference, caplog
):
    ref_out, _ = reference
    out = tmp_path / "run"
    _stopped_run(monkeypatch, _opts(tiny, out), 2)
    isolate_judge_env(monkeypatch, tmp_path)
    lines = [json.loads(x) for x in (out / "sequence.jsonl").read_text().splitlines()]
    lines[1]["rounds"][0]["loss"] += 1.0  # as if recorded on another machine
    (out / "sequence.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    for p in (out / STATE_DIR).iterdir():
        p.unlink()
    with caplog.at_level(logging.INFO, logger="benchmarks.run.case_loop"):
        run_benchmark(_opts(tiny, out))
    assert "edit 2 computes other values than recorded" in caplog.text
    assert _untimed(out / "results.jsonl") == _untimed(ref_out / "results.jsonl")
    assert _untimed(out / "checkpoints.jsonl") == _untimed(ref_out / "checkpoints.jsonl")


@pytest.mark.slow
def test_a_block_without_recorded_edits_starts_over_and_redoes_its_checkpoints(
    tiny, tmp_path, monkeypatch, reference
):
    ref_out, _ = reference
    out = tmp_path / "run"
    _stopped_run(monkeypatch, _opts(tiny, out), 2)  # the checkpoint after 1 edit is evaluated
    isolate_judge_env(monkeypatch, tmp_path)
    # the edit lines lost, the checkpoint's record left: it belongs to edits no longer known
    (out / "sequence.jsonl").write_text("")
    for p in (out / STATE_DIR).iterdir():
        p.unlink()
    lines = [json.loads(x) for x in (out / "checkpoints.jsonl").read_text().splitlines()]
    assert [r["checkpoint"] for r in lines] == [1]
    lines[0]["stale"] = True  # a record no edit of this run made
    (out / "checkpoints.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    run_benchmark(_opts(tiny, out))
    assert _untimed(out / "checkpoints.jsonl") == _untimed(ref_out / "checkpoints.jsonl")


def _stop_in_evaluation(monkeypatch, out, edits_made, batches):
    """The run stops (as a Ctrl-C would) in the evaluation that starts once ``edits_made`` edits are
    recorded, right after its batch number ``batches`` of answers is stored."""
    import hpse_easyedit

    real = hpse_easyedit.generate_answers

    def generate(*args, on_batch=None, **kw):
        if len(_text(out / "sequence.jsonl").splitlines()) != edits_made:
            return real(*args, on_batch=on_batch, **kw)
        stored = []

        def store(answers):
            on_batch(answers)
            stored.append(answers)
            if len(stored) == batches:
                raise KeyboardInterrupt

        return real(*args, on_batch=store, **kw)

    monkeypatch.setattr(hpse_easyedit, "generate_answers", generate)


def _questions_asked(monkeypatch, out):
    """How many questions the run asks, by the edits recorded when it asks them."""
    import hpse_easyedit

    real, asked = hpse_easyedit.generate_answers, {}

    def generate(*args, **kw):
        made = len(_text(out / "sequence.jsonl").splitlines())
        asked[made] = asked.get(made, 0) + len(args[2])
        return real(*args, **kw)

    monkeypatch.setattr(hpse_easyedit, "generate_answers", generate)
    return asked


@pytest.mark.slow
@pytest.mark.parametrize("edits_made", [3, 4], ids=["at-a-checkpoint", "after-the-last-edit"])
def test_an_evaluation_stopped_part_way_goes_on_from_its_next_batch(
    tiny, tmp_path, monkeypatch, reference, edits_made, caplog
):
    """A stop in the middle of a sequence's evaluation keeps the batches of answers made so far: the
    rerun makes only the others and ends with the uninterrupted run's records."""
    ref_out, ref_summary = reference
    out, full = tmp_path / "run", tmp_path / "full"
    _stop_in_evaluation(monkeypatch, out, edits_made, 2)
    with pytest.raises(KeyboardInterrupt):
        run_benchmark(_opts(tiny, out, batch_size=2))
    assert len(_text(out / "sequence-answers.jsonl").splitlines()) == 2
    monkeypatch.undo()
    isolate_judge_env(monkeypatch, tmp_path)
    resumed = _questions_asked(monkeypatch, out)
    with caplog.at_level(logging.INFO, logger="benchmarks.run.case_loop"):
        summary = run_benchmark(_opts(tiny, out, batch_size=2))
    assert "2 of " in caplog.text and "batches were answered before the stop" in caplog.text
    uninterrupted = _questions_asked(monkeypatch, full)
    run_benchmark(_opts(tiny, full, batch_size=2))
    # the two kept batches (two questions each) were not asked again
    assert resumed[edits_made] == uninterrupted[edits_made] - 4
    assert _untimed(out / "results.jsonl") == _untimed(full / "results.jsonl")
    assert _untimed(out / "checkpoints.jsonl") == _untimed(full / "checkpoints.jsonl")
    assert summary["checkpoints"] == ref_summary["checkpoints"]
    assert not _text(out / "sequence-answers.jsonl") and not _text(out / "sequence.jsonl")


@pytest.mark.slow
def test_ftm_sequence_resumes_from_its_snapshot(tiny, tmp_path, monkeypatch):
    ref = run_benchmark(
        _opts(tiny, tmp_path / "ref", "ftm.yaml", limit=3, sequential=3, checkpoints=[2])
    )
    out = tmp_path / "run"
    _stopped_run(
        monkeypatch, _opts(tiny, out, "ftm.yaml", limit=3, sequential=3, checkpoints=[2]), 2
    )
    isolate_judge_env(monkeypatch, tmp_path)
    again = run_benchmark(_opts(tiny, out, "ftm.yaml", limit=3, sequential=3, checkpoints=[2]))
    assert _untimed(out / "results.jsonl") == _untimed(tmp_path / "ref" / "results.jsonl")
    assert again["checkpoints"] == ref["checkpoints"]


def test_checkpoint_options_are_checked_before_anything_runs(tiny, tmp_path, reference):
    with pytest.raises(ValueError, match="--checkpoints evaluates a continual sequence"):
        _opts(tiny, tmp_path / "x", sequential=None)
    with pytest.raises(ValueError, match="from 1 to 3"):
        _opts(tiny, tmp_path / "x", checkpoints=[4])
    with pytest.raises(
        ConfigMismatchError, match="checkpoints"
    ):  # other checkpoints are another run
        run_benchmark(_opts(tiny, reference[0], checkpoints=[2]))


@pytest.mark.slow
def test_the_continual_table_reads_a_run_at_each_checkpoint(tiny, tmp_path, reference):
    from benchmarks.analysis.continual import continual_rows

    hpse_out, _ = reference
    lora_out = tmp_path / "lora"
    run_benchmark(_opts(tiny, lora_out, overrides=["kl_weight=0"]))
    pairs = [(f"{lora_out}@{c}", f"{hpse_out}@{c}") for c in (1, 3)] + [
        (str(lora_out), str(hpse_out))
    ]
    rows = continual_rows(pairs, ["LoRA"] * 3, resamples=200)
    assert [(r["label"], r["T"], r["cases"]) for r in rows] == [
        ("LoRA", 1, 1),
        ("LoRA + HPSE", 1, 1),
        ("LoRA", 3, 3),
        ("LoRA + HPSE", 3, 3),
        ("LoRA", 4, 4),
        ("LoRA + HPSE", 4, 4),
    ]
    with pytest.raises(ValueError, match="no checkpoint after 2 edits"):
        continual_rows([(f"{lora_out}@2", f"{hpse_out}@2")], ["LoRA"])


@pytest.mark.slow
def test_a_checkpoint_longer_than_one_batch_answers_under_a_progress_bar(
    tiny, tmp_path, capsys, reference
):
    """A checkpoint (and a block's final evaluation) of more than one batch of answers shows how far
    they got."""
    run_benchmark(_opts(tiny, tmp_path / "run", batch_size=1))
    err = capsys.readouterr().err
    assert "block 0: checkpoint after 3 edits" in err and "block 0: answers after 4 edits" in err
    assert len(_untimed(tmp_path / "run" / "checkpoints.jsonl")) == len(
        _untimed(reference[0] / "checkpoints.jsonl")
    )


def test_generate_answers_reports_each_batch(tiny):
    from hpse_easyedit import generate_answers, load_model
    from hpse_easyedit.hparams import HPSEHyperParams

    model, tok = load_model(HPSEHyperParams.from_hparams(str(tiny / "hpse.yaml")))
    done = []
    answers = generate_answers(
        model,
        tok,
        ["Who?", "Where?", "When?"],
        max_new_tokens=2,
        batch_size=2,
        progress=done.append,
    )
    assert len(answers) == 3 and done == [2, 1]
