"""The runner end to end on a tiny random model: both benchmarks, continual editing, kill + resume,
config protection, the judge endpoint, and the comparison script."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bench_helpers import DATA_DIR, ChatServer, isolate_judge_env, judge_like_responder
from benchmarks.analysis.compare import compare_main
from benchmarks.records.store import ConfigMismatchError
from benchmarks.run.cli import cli_main
from benchmarks.run.methods import MethodSpec, get_method, register_method
from benchmarks.run.runner import RunOptions, run_benchmark
from benchmarks.tasks.judge import JudgeSettings

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(
    not DATA_DIR.is_dir(), reason="needs ../shared/data next to the repository"
)

TINY_HPARAMS = """alg_name: {alg}
model_name: {model}
rounds: 1
inner_steps: 1
max_new_tokens: 4
lr: 1.0e-3
"""


@pytest.fixture(scope="module")
def tiny_files(tiny_model):
    return {
        "hpse.yaml": TINY_HPARAMS.format(alg="HPSE", model=tiny_model),
        "spy.yaml": TINY_HPARAMS.format(alg="SPY", model=tiny_model),
    }


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path):
    isolate_judge_env(monkeypatch, tmp_path)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class Spy:
    """HPSE through the registry, recording which model each edit started from."""

    def __init__(self):
        self.calls = []  # (model id, weights equal to the unedited ones?)
        self.prompts = []  # the request prompts of each edit
        self.original = None

    def factory(self):
        import yaml

        from hpse_easyedit import HPSEHyperParams

        hpse = get_method("HPSE")

        def load_hparams(path, overrides):
            config = yaml.safe_load(Path(path).read_text())
            config["alg_name"] = "HPSE"
            return HPSEHyperParams.from_dict(config).with_overrides(list(overrides))

        def load_model(hp):
            model, tok = hpse.load_model(hp)
            self.original = _state(model)
            return model, tok

        def edit(model, tok, requests, hp):
            # an adapter still attached, or any weight changed, means the model carries an edit
            unedited = not hasattr(model, "peft_config") and all(
                torch.equal(v, self.original[k]) for k, v in _state(model).items()
            )
            self.calls.append((id(model), unedited))
            self.prompts.append([r["prompt"] for r in requests])
            return hpse.edit(model, tok, requests, hp)

        return MethodSpec("SPY", load_hparams, hpse.hparams_dict, load_model, edit, hpse.restore)


def _opts(tiny, tmp_path, benchmark, **kw):
    base = dict(
        benchmark=benchmark,
        hparams=str(tiny / "hpse.yaml"),
        data_dir=str(DATA_DIR),
        out_dir=str(tmp_path / "out"),
        limit=2,
        max_new_tokens=6,
        batch_size=4,
        judge="lexical",
    )
    if benchmark == "unkebench":  # MMLU is UnKEBench's own option
        base.update(mmlu_n=2, mmlu_shots=1)
    base.update(kw)
    return RunOptions(**base)


def _lines(out):
    return [json.loads(x) for x in (Path(out) / "results.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_tiny_single_editing_run_both_benchmarks(tiny, tmp_path):
    spy = Spy()
    register_method(spy.factory())
    mq = run_benchmark(
        _opts(
            tiny,
            tmp_path,
            "mquake-uns",
            hparams=str(tiny / "spy.yaml"),
            limit=3,
            out_dir=str(tmp_path / "mq"),
        )
    )
    assert [u for _, u in spy.calls] == [
        True,
        True,
        True,
    ]  # every case edited into the unedited model
    assert set(mq) >= {"Ind", "Cmp", "Avg", "n_cases", "stepin_rate_by_round", "hparams"}
    assert (
        mq["n_cases"] == 3 and len(mq["stepin_rate_by_round"]) == 1 and mq["hparams"]["rounds"] == 1
    )
    recs = _lines(tmp_path / "mq")
    raw = json.loads((DATA_DIR / "akew" / "MQuAKE-CF.json").read_text())[:3]
    assert [r["case_id"] for r in recs] == [str(c["case_id"]) for c in raw]
    assert mq["Ind"] == pytest.approx(100 * sum(r["Ind"] for r in recs) / 3)
    assert mq["Avg"] == pytest.approx((mq["Ind"] + mq["Cmp"]) / 2)
    assert all(len(r["rounds"]) == 1 and len(r["answers"]["multi_hop"]) == 3 for r in recs)
    assert json.loads((tmp_path / "mq" / "summary.json").read_text())["Ind"] == mq["Ind"]
    assert "| method | Ind | Cmp | Avg |" in (tmp_path / "mq" / "table.md").read_text()

    unke = run_benchmark(_opts(tiny, tmp_path, "unkebench", out_dir=str(tmp_path / "unke")))
    assert set(unke) >= {
        "Jnt",
        "Dmp",
        "Div",
        "Avg",
        "MMLU_before",
        "MMLU_after",
        "judge",
        "n_cases",
        "stepin_rate_by_round",
        "hparams",
    }
    assert unke["judge"] == "lexical-fallback" and unke["n_cases"] == 2
    assert unke["MMLU_before"] in (0.0, 50.0, 100.0) and unke["MMLU_after"] in (0.0, 50.0, 100.0)
    recs = _lines(tmp_path / "unke")
    assert all(r["judge"] == "lexical-fallback" for r in recs)
    assert unke["Div"] == pytest.approx(100 * sum(r["Div"] for r in recs) / 2)
    assert unke["Avg"] == pytest.approx((unke["Jnt"] + unke["Dmp"] + unke["Div"]) / 3)
    assert "lexical-fallback" in (tmp_path / "unke" / "table.md").read_text()


def test_editing_prompt_override_reaches_the_requests(tiny, tmp_path):
    spy = Spy()
    register_method(spy.factory())
    run_benchmark(
        _opts(
            tiny,
            tmp_path,
            "unkebench",
            hparams=str(tiny / "spy.yaml"),
            limit=1,
            mmlu_n=0,
            overrides=["editing_prompt=List the key facts about {subject}."],
            out_dir=str(tmp_path / "uk"),
        )
    )
    assert len(spy.prompts) == 1 and len(spy.prompts[0]) == 1
    assert spy.prompts[0][0].startswith("List the key facts about ") and spy.prompts[0][0].endswith(
        "."
    )
    run_benchmark(
        _opts(
            tiny,
            tmp_path,
            "mquake-uns",
            hparams=str(tiny / "spy.yaml"),
            limit=1,
            out_dir=str(tmp_path / "mq"),
        )
    )
    assert spy.prompts[1] and all(
        p.startswith("Introduce ") for p in spy.prompts[1]
    )  # the file's default


@pytest.mark.slow
def test_cases_option_runs_only_the_named_cases_and_a_later_run_fills_in(tiny, tmp_path):
    spy = Spy()
    register_method(spy.factory())
    ids = [
        str(c["case_id"])
        for c in json.loads((DATA_DIR / "akew" / "MQuAKE-CF.json").read_text())[:3]
    ]
    out = str(tmp_path / "mq")
    first = run_benchmark(
        _opts(
            tiny,
            tmp_path,
            "mquake-uns",
            hparams=str(tiny / "spy.yaml"),
            out_dir=out,
            limit=None,
            cases=[f" {ids[2]}", ids[0]],
        )
    )
    assert [r["case_id"] for r in _lines(out)] == [ids[0], ids[2]] and first[
        "n_cases"
    ] == 2  # data order
    assert len(spy.calls) == 2
    more = run_benchmark(
        _opts(tiny, tmp_path, "mquake-uns", hparams=str(tiny / "spy.yaml"), out_dir=out, limit=3)
    )
    assert more["n_cases"] == 3 and len(spy.calls) == 3  # only the missing case is edited
    assert sorted(r["case_id"] for r in _lines(out)) == sorted(ids)
    with pytest.raises(
        ValueError, match=r"--cases: no case_id nope among the first 2 cases \(--limit\)"
    ):
        run_benchmark(
            _opts(
                tiny,
                tmp_path,
                "mquake-uns",
                hparams=str(tiny / "spy.yaml"),
                out_dir=out,
                cases=["nope"],
            )
        )
    with pytest.raises(ValueError, match="--sequential"):
        _opts(tiny, tmp_path, "mquake-uns", cases=[ids[0]], sequential=2)
    with pytest.raises(ValueError, match="names no case id"):
        _opts(tiny, tmp_path, "mquake-uns", cases=[""])


@pytest.mark.slow
def test_each_invocation_that_edits_records_its_environment(tiny, tmp_path, monkeypatch):
    import transformers

    register_method(Spy().factory())
    monkeypatch.setenv("EASYEDIT_SRC", str(tmp_path / "not-a-checkout"))
    ids = [
        str(c["case_id"])
        for c in json.loads((DATA_DIR / "akew" / "MQuAKE-CF.json").read_text())[:3]
    ]
    out = tmp_path / "mq"
    threads = torch.get_num_threads()
    try:
        # the third run has nothing to do and records nothing
        for limit, n_threads in ((2, 1), (3, 2), (3, 2)):
            torch.set_num_threads(n_threads)  # the second resumes under another thread count
            run_benchmark(
                _opts(
                    tiny,
                    tmp_path,
                    "mquake-uns",
                    hparams=str(tiny / "spy.yaml"),
                    out_dir=str(out),
                    limit=limit,
                )
            )
    finally:
        torch.set_num_threads(threads)
    lines = [json.loads(line) for line in (out / "environments.jsonl").read_text().splitlines()]
    assert [line["cases"] for line in lines] == [ids[:2], ids[2:]]
    assert all(line["transformers"] == transformers.__version__ and line["torch"] for line in lines)
    assert [line["torch_threads"] for line in lines] == [1, 2]
    assert lines[0]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    repo = Path(__file__).resolve().parents[1]
    if (repo / ".git").exists():  # the commit the run came from, marked where the tree differs
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        assert lines[0]["commit"] in (head, f"{head}-dirty")
    assert lines[0]["easyedit"] == {"src": str(tmp_path / "not-a-checkout"), "commit": None}
    assert (lines[0]["rank"], lines[0]["world"]) == (0, 1)
    assert "environments" not in json.dumps(
        json.loads((out / "config.json").read_text())
    )  # not part of what must match


@pytest.mark.slow
def test_mmlu_every_k_measures_only_every_kth_edit_and_is_part_of_the_config(tiny, tmp_path):
    opts = dict(limit=3, mmlu_every=2, out_dir=str(tmp_path / "every"))
    summary = run_benchmark(_opts(tiny, tmp_path, "unkebench", **opts))
    recs = _lines(tmp_path / "every")
    assert ["MMLU_after" in r for r in recs] == [True, False, True]  # cases 0 and 2
    assert summary["MMLU_edits"] == 2
    assert summary["MMLU_after"] == pytest.approx(
        sum(r["MMLU_after"] for r in recs if "MMLU_after" in r) / 2
    )
    assert json.loads((tmp_path / "every" / "config.json").read_text())["mmlu"]["every"] == 2
    with pytest.raises(ConfigMismatchError):  # another sampling of MMLU is another configuration
        run_benchmark(_opts(tiny, tmp_path, "unkebench", **{**opts, "mmlu_every": 1}))
    with pytest.raises(ValueError, match="--mmlu-every"):
        _opts(tiny, tmp_path, "unkebench", mmlu_every=0)


def test_tiny_continual_editing_blocks(tiny, tmp_path):
    spy = Spy()
    register_method(spy.factory())
    summary = run_benchmark(
        _opts(tiny, tmp_path, "mquake-uns", hparams=str(tiny / "spy.yaml"), limit=3, sequential=2)
    )
    recs = _lines(tmp_path / "out")
    assert (
        [r["block"] for r in recs] == [0, 0, 1]
        and summary["mode"] == "sequential"
        and summary["n_cases"] == 3
    )
    # block 0: unedited, then the edited model of the first edit; block 1 starts from the unedited
    # model again
    assert [u for _, u in spy.calls] == [True, False, True]


@pytest.mark.slow
def test_rerun_same_config_resumes_different_config_is_refused(tiny, tmp_path):
    first = run_benchmark(_opts(tiny, tmp_path, "mquake-uns"))
    before = (tmp_path / "out" / "results.jsonl").read_bytes()
    again = run_benchmark(_opts(tiny, tmp_path, "mquake-uns"))
    assert (tmp_path / "out" / "results.jsonl").read_bytes() == before
    assert again["Ind"] == first["Ind"] and again["n_cases"] == 2
    more = run_benchmark(_opts(tiny, tmp_path, "mquake-uns", limit=3))  # a larger limit resumes
    assert more["n_cases"] == 3 and (tmp_path / "out" / "results.jsonl").read_bytes().startswith(
        before
    )
    with pytest.raises(ConfigMismatchError, match="kl_weight: 1.0 -> 0.0"):
        run_benchmark(_opts(tiny, tmp_path, "mquake-uns", overrides=["kl_weight=0"]))
    with pytest.raises(ConfigMismatchError, match="max_new_tokens"):
        run_benchmark(_opts(tiny, tmp_path, "mquake-uns", max_new_tokens=7))


def _env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "HPSE_JUDGE_"))}
    env.update(
        HPSE_CACHE_DIR=str(tmp_path / "cache"), HPSE_DATA_DIR=str(DATA_DIR), PYTHONUNBUFFERED="1"
    )
    return env


@pytest.mark.slow
def test_killed_run_resumes_without_losing_or_duplicating_cases(tiny, tmp_path, caplog):
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        str(REPO / "run_examples" / "run_hpse_mquake.py"),
        "--hparams",
        str(tiny / "hpse.yaml"),
        "--limit",
        "5",
        "--max-new-tokens",
        "4",
        "--out",
        str(out),
        "--log-level",
        "WARNING",
    ]
    proc = subprocess.Popen(
        cmd, env=_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    results = out / "results.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if results.is_file() and results.read_bytes().count(b"\n") >= 2:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    kept = results.read_bytes()
    n_kept = kept.count(b"\n")
    assert 2 <= n_kept < 5
    with open(
        results, "ab"
    ) as fh:  # as if the kill had landed in the middle of writing the next line
        fh.write(b'{"case_id": "99", "Ind": ')
    done = subprocess.run(cmd, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    final = results.read_bytes()
    assert final.startswith(kept)  # what was written before the kill is untouched
    ids = [json.loads(x)["case_id"] for x in final.decode().splitlines()]
    expected = [
        str(c["case_id"])
        for c in json.loads((DATA_DIR / "akew" / "MQuAKE-CF.json").read_text())[:5]
    ]
    assert sorted(ids) == sorted(expected) and len(ids) == 5
    assert "| method | Ind | Cmp | Avg |" in done.stdout
    assert json.loads((out / "summary.json").read_text())["n_cases"] == 5
    assert cli_main("mquake-uns", cmd[2:] + ["--data", str(DATA_DIR), "--set", "kl_weight=0"]) == 2
    assert (
        "already holds results of a different configuration (hparams.kl_weight: 1.0 -> 0.0)"
        in caplog.text
    )
    assert results.read_bytes() == final


@pytest.mark.slow
def test_unkebench_with_llm_judge_endpoint_and_free_rerun(tiny, tmp_path):
    with ChatServer(judge_like_responder) as server:
        settings = JudgeSettings(
            base_url=server.url, model="judge-x", api_key="sk-SECRET-never-written"
        )
        first = run_benchmark(
            _opts(
                tiny,
                tmp_path,
                "unkebench",
                judge="llm",
                judge_settings=settings,
                mmlu_n=0,
                out_dir=str(tmp_path / "a"),
            )
        )
        assert (
            first["judge"] == "llm:judge-x"
            and first["Dmp"] == 100.0
            and first["MMLU_before"] is None
        )
        sent = len(server.prompts)
        assert sent >= 2 * (
            1 + 2
        )  # per case: one coverage prompt, and per joint answer decomposition + support
        second = run_benchmark(
            _opts(
                tiny,
                tmp_path,
                "unkebench",
                judge="llm",
                judge_settings=settings,
                mmlu_n=0,
                out_dir=str(tmp_path / "b"),
            )
        )
        assert len(server.prompts) == sent  # same answers, same prompts: all from the judge cache
        assert second["Jnt"] == first["Jnt"]
    recs = _lines(tmp_path / "a")
    assert all(r["judge"] == "llm:judge-x" and r["judge_complete"] for r in recs)
    written = [p for p in (tmp_path / "a").rglob("*") if p.is_file()] + [
        p for p in (tmp_path / "cache").rglob("*") if p.is_file()
    ]
    assert written and not any(b"sk-SECRET-never-written" in p.read_bytes() for p in written)


@pytest.mark.slow
def test_run_compare_pairs_every_row_with_the_reference_and_times_each_edit(tiny, tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = [
        "--benchmark",
        "mquake-uns",
        "--limit",
        "2",
        "--max-new-tokens",
        "4",
        "--out",
        str(out),
        "--data",
        str(DATA_DIR),
        "--log-level",
        "WARNING",
        "--resamples",
        "200",
        "--method",
        "LoRA",
        str(tiny / "hpse.yaml"),
        "kl_weight=0",
        "--method",
        "LoRA + HPSE",
        str(tiny / "hpse.yaml"),
        "--reference",
        "LoRA + HPSE",
    ]
    with pytest.raises(SystemExit) as exc:  # an unknown reference is refused before any edit
        compare_main([*argv[:-1], "HPSE"])
    assert exc.value.code == 2 and not out.exists()
    assert compare_main(argv) == 0
    assert (out / "compare.md").read_text().splitlines()[
        0
    ] == "| method | Ind | Cmp | Avg |"  # the paper's layout
    table = (out / "paired.md").read_text()
    assert table in capsys.readouterr().out
    summaries = json.loads((out / "compare.json").read_text())
    seconds = {
        label: summaries[label]["mquake-uns"]["edit_seconds_mean"]
        for label in ("LoRA", "LoRA + HPSE")
    }
    assert all(v > 0 for v in seconds.values())
    for label, value in seconds.items():
        assert f"| {label} | {value:.1f} |" in table  # the wall-time table, one row per method
    paired = json.loads((out / "paired.json").read_text())
    assert paired["reference"] == "LoRA + HPSE"
    report = paired["benchmarks"]["mquake-uns"]
    assert report["n_cases"] == 2
    assert report["runs"] == [
        str(out / "mquake-uns" / "LoRA_+_HPSE"),
        str(out / "mquake-uns" / "LoRA"),
    ]
    avg = report["pairs"][0]["metrics"]["Avg"]
    lora = {
        r["case_id"]: r
        for r in map(json.loads, (out / "mquake-uns" / "LoRA" / "results.jsonl").open())
    }
    hpse = {
        r["case_id"]: r
        for r in map(json.loads, (out / "mquake-uns" / "LoRA_+_HPSE" / "results.jsonl").open())
    }
    expected = (
        sum(
            ((lora[c]["Ind"] + lora[c]["Cmp"]) - (hpse[c]["Ind"] + hpse[c]["Cmp"])) / 2
            for c in lora
        )
        / 2
    )
    assert avg["diff"] == pytest.approx(expected)  # LoRA - reference, per case, averaged
    assert "Paired with LoRA + HPSE" in table and "Avg - LoRA + HPSE (95% CI)" in table
    row = next(line for line in table.splitlines() if line.startswith("| LoRA |") and "/" in line)
    assert (
        f"{avg['diff']:+.1f} [" in row
        and f"{avg['b_wins']} / {avg['ties']} / {avg['b_losses']}" in row
    )


def test_run_compare_takes_set_and_keeps_every_row_in_its_own_folder(tmp_path, monkeypatch):
    """``--set`` as the runners take it (after a --method: that method's; before the first: every
    method's), the old ``LABEL FILE KEY=VALUE`` form still read; a label such as ``..`` used to make
    its run folder the comparison's own directory and fail late, on the second benchmark."""
    from benchmarks.analysis import compare

    hp = tmp_path / "hp.yaml"
    hp.write_text("alg_name: HPSE\nmodel_name: m\n")
    runs = []

    class Stop(Exception):
        pass

    def run(opts):
        runs.append((opts.benchmark, opts.label, Path(opts.out_dir), opts.overrides))
        if len(runs) == 4:
            raise Stop
        return {"stepin_rate_by_round": []}

    monkeypatch.setattr(compare, "run_benchmark", run)
    out = tmp_path / "cmp"
    argv = ["--out", str(out), "--set", "rounds=3"]
    argv += ["--method", "..", str(hp), "--set", "kl_weight=0", "--limit", "1"]
    argv += ["--method", "B", str(hp), "unkebench:max_new_tokens=128", "--set=lr=0.001"]
    with pytest.raises(Stop):
        compare.compare_main(argv)
    assert sorted(runs, key=lambda r: (r[1], r[0])) == [
        ("mquake-uns", "..", out / "mquake-uns" / "method", ["rounds=3", "kl_weight=0"]),
        ("unkebench", "..", out / "unkebench" / "method", ["rounds=3", "kl_weight=0"]),
        ("mquake-uns", "B", out / "mquake-uns" / "B", ["rounds=3", "lr=0.001"]),
        ("unkebench", "B", out / "unkebench" / "B", ["rounds=3", "max_new_tokens=128", "lr=0.001"]),
    ]


@pytest.mark.slow
def test_run_compare_table_and_plot(tiny, tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = [
        "--benchmark",
        "mquake-uns",
        "--limit",
        "2",
        "--max-new-tokens",
        "4",
        "--out",
        str(out),
        "--data",
        str(DATA_DIR),
        "--log-level",
        "WARNING",
        "--method",
        "LoRA",
        str(tiny / "hpse.yaml"),
        "kl_weight=0",
        "--method",
        "LoRA + HPSE",
        str(tiny / "hpse.yaml"),
    ]
    assert compare_main(argv) == 0
    table = (out / "compare.md").read_text()
    assert table in capsys.readouterr().out
    assert table.splitlines()[0] == "| method | Ind | Cmp | Avg |"
    assert table.splitlines()[2].startswith("| LoRA |") and table.splitlines()[3].startswith(
        "| LoRA + HPSE |"
    )
    summaries = json.loads((out / "compare.json").read_text())
    assert summaries["LoRA"]["mquake-uns"]["hparams"]["kl_weight"] == 0.0
    assert summaries["LoRA"]["mquake-uns"]["stepin_rate_by_round"] == [
        None
    ]  # no rollout without the KL term
    assert len(summaries["LoRA + HPSE"]["mquake-uns"]["stepin_rate_by_round"]) == 1
    assert (out / "stepin_by_round.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "mquake-uns" / "LoRA" / "results.jsonl").is_file()
    with pytest.raises(SystemExit):  # case ids belong to one benchmark
        compare_main(
            [
                "--benchmark",
                "mquake-uns",
                "unkebench",
                "--cases",
                "1",
                "--out",
                str(tmp_path / "two"),
                "--method",
                "LoRA",
                str(tiny / "hpse.yaml"),
            ]
        )
