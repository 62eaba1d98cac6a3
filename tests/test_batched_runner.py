"""``--cases-at-once``: a benchmark run that edits several cases in one batched pass writes the
records a one-at-a-time run writes (the same rollouts, answers and scores on a tiny model), resumes
a batch cut short by editing it again whole, and refuses what it cannot do in one line."""

import json
from pathlib import Path

import pytest

from bench_helpers import DATA_DIR, isolate_judge_env
from benchmarks.run.cli import cli_main
from benchmarks.run.runner import RunOptions, run_benchmark
from hpse_easyedit.errors import UsageError

pytestmark = pytest.mark.skipif(
    not DATA_DIR.is_dir(), reason="needs ../shared/data next to the repository"
)

HPARAMS = """alg_name: HPSE
model_name: {model}
executor: {executor}
rounds: 2
inner_steps: 2
max_new_tokens: 6
lr: 1.0e-2
"""

#: what a record holds about timing (differs between any two runs)
TIMING = ("edit_seconds", "seconds", "rollout_seconds")


@pytest.fixture(scope="module")
def tiny_files(saved_tiny_model):
    """``tiny``'s files: one hparams file per executor, on the tiny Llama at std 0.2."""
    model = saved_tiny_model("llama", init_std=0.2)
    return {
        f"{executor}.yaml": HPARAMS.format(model=model, executor=executor)
        + ("ftm_layer: 1\n" if executor == "ft_m" else "")
        for executor in ("lora", "ft_m")
    }


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path):
    isolate_judge_env(monkeypatch, tmp_path)


def _opts(tiny, out, executor="lora", **kw):
    base = dict(
        benchmark="mquake-uns",
        hparams=str(tiny / f"{executor}.yaml"),
        data_dir=str(DATA_DIR),
        out_dir=str(out),
        limit=5,
        max_new_tokens=6,
        batch_size=4,
        judge="lexical",
    )
    base.update(kw)
    return RunOptions(**base)


def _records(out):
    lines = (Path(out) / "results.jsonl").read_text().splitlines()
    return {r["case_id"]: r for r in map(json.loads, lines)}


def _without_timing(value):
    if isinstance(value, dict):
        return {k: _without_timing(v) for k, v in value.items() if k not in TIMING}
    if isinstance(value, list):
        return [_without_timing(v) for v in value]
    return value


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["lora", "ft_m"])
def test_a_batched_run_writes_the_records_of_a_solo_run(tiny, tmp_path, executor):
    run_benchmark(_opts(tiny, tmp_path / "solo", executor))
    run_benchmark(_opts(tiny, tmp_path / "batched", executor, cases_at_once=3))
    solo, batched = _records(tmp_path / "solo"), _records(tmp_path / "batched")
    assert list(solo) == list(batched)
    for case_id in solo:
        mine, theirs = _without_timing(batched[case_id]), _without_timing(solo[case_id])
        # the answers and scores are the solo run's; the losses agree to float32 rounding
        for key in set(theirs) - {"rounds"}:
            assert mine[key] == theirs[key], (case_id, key)
        for a, b in zip(mine["rounds"], theirs["rounds"]):
            assert a.keys() == b.keys()
            for key in a:
                assert a[key] == pytest.approx(b[key], rel=1e-4), (case_id, key)
    from benchmarks.analysis.twin import twin_report

    twin = twin_report(tmp_path / "solo", tmp_path / "batched")
    assert twin["cases"] == 5
    assert twin["identical_rollouts"] == twin["identical_answers"] == 5
    assert twin["avg_difference"] == 0 and twin["differences"] == {}
    config = json.loads((tmp_path / "batched" / "config.json").read_text())
    assert config["cases_at_once"] == 3
    assert "cases_at_once" not in json.loads((tmp_path / "solo" / "config.json").read_text())
    env = [
        json.loads(x)
        for x in (tmp_path / "batched" / "environments.jsonl").read_text().splitlines()
    ]
    assert env[-1]["cases_at_once"] == 3


@pytest.mark.slow
def test_a_batch_cut_short_is_edited_again_whole(tiny, tmp_path, monkeypatch):
    """A stop after the first record of a batch of 3: the resume edits the same 3 cases together
    (so the same rounding as one uninterrupted run) and records only the 2 missing; the run's
    records equal an uninterrupted batched run's."""
    from benchmarks.run import case_loop

    run_benchmark(_opts(tiny, tmp_path / "whole", cases_at_once=3))
    real = case_loop.SingleLoop._finish
    batches = []

    def stop_after_first(self, rec, progress):
        real(self, rec, progress)
        raise KeyboardInterrupt

    monkeypatch.setattr(case_loop.SingleLoop, "_finish", stop_after_first)
    with pytest.raises(KeyboardInterrupt):
        run_benchmark(_opts(tiny, tmp_path / "cut", cases_at_once=3))
    assert len(_records(tmp_path / "cut")) == 1
    monkeypatch.setattr(case_loop.SingleLoop, "_finish", real)
    import dataclasses

    from hpse_easyedit import methods

    spec = methods.get_method("HPSE")

    def spy(model, tok, cases, hp, **kw):
        batches.append(len(cases))
        return spec.edit_cases(model, tok, cases, hp, **kw)

    monkeypatch.setitem(methods._METHODS, "HPSE", dataclasses.replace(spec, edit_cases=spy))
    run_benchmark(_opts(tiny, tmp_path / "cut", cases_at_once=3))
    assert batches == [3, 2]  # the cut batch again whole, then the last two cases
    whole, cut = _records(tmp_path / "whole"), _records(tmp_path / "cut")
    assert sorted(whole) == sorted(cut)
    for case_id in whole:
        assert _without_timing(whole[case_id]) == _without_timing(cut[case_id])


@pytest.mark.slow
def test_a_solo_run_resumes_batched_and_cases_at_once_is_refused_where_it_cannot_work(
    tiny, tmp_path
):
    run_benchmark(_opts(tiny, tmp_path / "out", limit=2))
    run_benchmark(_opts(tiny, tmp_path / "out", limit=5, cases_at_once=3))  # no config mismatch
    assert len(_records(tmp_path / "out")) == 5
    with pytest.raises(UsageError, match="--cases-at-once.*--sequential"):
        _opts(tiny, tmp_path / "seq", cases_at_once=2, sequential=2)
    with pytest.raises(UsageError, match="--cases-at-once"):
        _opts(tiny, tmp_path / "zero", cases_at_once=0)


def test_the_runner_command_line_takes_cases_at_once(tiny, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        cli_main("mquake-uns", ["--help"])
    assert stop.value.code == 0
    assert "--cases-at-once" in capsys.readouterr().out


def _checkpoint_records(out):
    path = Path(out) / "checkpoints.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    return {(r["checkpoint"], r["case_id"]): r for r in map(json.loads, lines)}


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["lora", "ft_m"])
def test_sequences_side_by_side_write_the_records_of_one_after_another(tiny, tmp_path, executor):
    """Three continual sequences of 2 edits with a checkpoint after the first: side by side
    (``--sequences-at-once 3``) they give the answers, scores and checkpoints of the sequences run
    one after another."""
    common = dict(limit=6, sequential=2, checkpoints=[1])
    run_benchmark(_opts(tiny, tmp_path / "solo", executor, **common))
    run_benchmark(_opts(tiny, tmp_path / "side", executor, sequences_at_once=3, **common))
    solo, side = _records(tmp_path / "solo"), _records(tmp_path / "side")
    assert list(solo) == list(side)
    for case_id in solo:
        mine, theirs = _without_timing(side[case_id]), _without_timing(solo[case_id])
        for key in set(theirs) - {"rounds"}:
            assert mine[key] == theirs[key], (case_id, key)
        for a, b in zip(mine["rounds"], theirs["rounds"]):
            for key in a:
                assert a[key] == pytest.approx(b[key], rel=1e-4), (case_id, key)
    checkpoints = _checkpoint_records(tmp_path / "solo")
    assert checkpoints and checkpoints == _checkpoint_records(tmp_path / "side")
    config = json.loads((tmp_path / "side" / "config.json").read_text())
    assert config["sequences_at_once"] == 3


@pytest.mark.slow
def test_sequences_side_by_side_resume_from_their_snapshots(tiny, tmp_path, monkeypatch):
    """A stop after the first edit of two sequences side by side: the rerun resumes each from its
    own snapshot (no edit is made twice) and ends with the uninterrupted run's records."""
    from hpse_easyedit import methods

    common = dict(limit=4, sequential=2, sequences_at_once=2)
    run_benchmark(_opts(tiny, tmp_path / "whole", **common))
    spec = methods.get_method("HPSE")
    calls = []

    def stop_after_one(model, tok, cases, hp, **kw):
        if calls:
            raise KeyboardInterrupt
        calls.append(len(cases))
        return spec.edit_cases(model, tok, cases, hp, **kw)

    import dataclasses

    monkeypatch.setitem(
        methods._METHODS, "HPSE", dataclasses.replace(spec, edit_cases=stop_after_one)
    )
    with pytest.raises(KeyboardInterrupt):
        run_benchmark(_opts(tiny, tmp_path / "cut", **common))
    assert sorted(p.name for p in (tmp_path / "cut" / "sequence-state").iterdir()) == [
        "state.block0.pt",
        "state.block1.pt",
    ]
    made = []

    def count(model, tok, cases, hp, **kw):
        made.append(len(cases))
        return spec.edit_cases(model, tok, cases, hp, **kw)

    monkeypatch.setitem(methods._METHODS, "HPSE", dataclasses.replace(spec, edit_cases=count))
    run_benchmark(_opts(tiny, tmp_path / "cut", **common))
    assert made == [2]  # only the second edit of each sequence
    whole, cut = _records(tmp_path / "whole"), _records(tmp_path / "cut")
    assert {k: _without_timing(v) for k, v in whole.items()} == {
        k: _without_timing(v) for k, v in cut.items()
    }
    assert not any((tmp_path / "cut" / "sequence-state").glob("*.pt"))


def test_sequences_at_once_needs_sequential(tiny, tmp_path):
    with pytest.raises(UsageError, match="--sequences-at-once.*--sequential"):
        _opts(tiny, tmp_path / "out", sequences_at_once=2)
