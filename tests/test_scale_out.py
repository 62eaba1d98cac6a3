"""Scale-out: benchmark runs sharded over processes, the merge, resume across process counts, the
tolerant run-directory identity, and models whose layers sit on several devices.

The multi-process test launches the real script with ``accelerate launch --multi_gpu --num_processes
2`` (on a machine without GPUs each process falls back to the CPU and gloo; accelerate's ``--cpu``
flag starts one process only unless an MPI hostfile is given), kills one process after its first
case and relaunches. The other shard tests drive the shards of an N-process layout one after another
in this process with an explicit ``ProcessContext``, which runs exactly the runner's code without a
process group.
"""

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bench_helpers import DATA_DIR, isolate_judge_env
from benchmarks.records.store import ConfigMismatchError, IncompleteRunError
from benchmarks.run.distributed import (
    LaunchError,
    ProcessContext,
    check_launch_environment,
    gpu_group,
)
from benchmarks.run.runner import RunOptions, config_policy, run_benchmark
from tiny_models import make_tiny_model_and_tokenizer, tiny_hparams

# the slow tier (`make test`, not `make test-fast`): accelerate launch subprocesses and sharded runs
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
needs_data = pytest.mark.skipif(
    not DATA_DIR.is_dir(), reason="needs ../shared/data next to the repository"
)

TINY_HPARAMS = """alg_name: HPSE
model_name: {model}
device: cpu
rounds: 2
inner_steps: 2
max_new_tokens: 6
lr: 1.0e-3
"""
TIMING = ("edit_seconds", "seconds", "rollout_seconds", "edit_seconds_mean", "out_dir")


@pytest.fixture(scope="module")
def tiny_files(tiny_model):
    return {"hpse.yaml": TINY_HPARAMS.format(model=tiny_model)}


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path):
    isolate_judge_env(monkeypatch, tmp_path)


@pytest.fixture()
def one_thread():
    """Same float summation order as the launched processes (OMP_NUM_THREADS=1), so records compare
    exactly."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _opts(tiny, out, **kw):
    base = dict(
        benchmark="mquake-uns",
        hparams=str(tiny / "hpse.yaml"),
        data_dir=str(DATA_DIR),
        out_dir=str(out),
        limit=6,
        max_new_tokens=6,
        batch_size=4,
        judge="lexical",
    )
    base.update(kw)
    return RunOptions(**base)


def _lines(path):
    return (
        [json.loads(x) for x in Path(path).read_text().splitlines()] if Path(path).is_file() else []
    )


def _strip(obj):
    """A record or summary without what legitimately differs between runs (timings, output
    directory)."""
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k not in TIMING}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def _by_id(records):
    return {str(r["case_id"]): _strip(r) for r in records}


@pytest.fixture(scope="module")
def reference(tiny, tmp_path_factory):
    """One process, no launcher: today's run (results.jsonl, summary.json, table.md, config.json,
    environments.jsonl)."""
    out = tmp_path_factory.mktemp("ref") / "out"
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        summary = run_benchmark(_opts(tiny, out))
    finally:
        torch.set_num_threads(before)
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "environments.jsonl",
        "results.jsonl",
        "summary.json",
        "table.md",
    ]
    return out, summary, _lines(out / "results.jsonl")


# -------------------------------------------------------------------------------- the real launcher
def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _descendants(root_pid):
    children = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [root_pid]
    while todo:
        pid = todo.pop()
        out += children.get(pid, [])
        todo += children.get(pid, [])
    return out


def _rank_pid(launcher_pid, rank):
    """The worker process of ``rank`` among the launcher's own descendants (never anybody else's
    process)."""
    for pid in _descendants(launcher_pid):
        try:
            env = dict(
                x.split("=", 1)
                for x in Path(f"/proc/{pid}/environ")
                .read_bytes()
                .decode(errors="replace")
                .split("\0")
                if "=" in x
            )
        except OSError:
            continue
        if (
            env.get("RANK") == str(rank)
            and env.get("WORLD_SIZE") == "2"
            and "run_hpse_mquake" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
        ):
            return pid
    return None


def _launch_cmd(tiny, out, port):
    return [
        str(Path(sys.executable).with_name("accelerate")),
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(port),
        str(REPO / "run_examples" / "run_hpse_mquake.py"),
        "--hparams",
        str(tiny / "hpse.yaml"),
        "--limit",
        "6",
        "--max-new-tokens",
        "6",
        "--batch-size",
        "4",
        "--judge",
        "lexical",
        "--out",
        str(out),
        "--log-level",
        "WARNING",
    ]


def _env(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENAI_", "HPSE_JUDGE_", "ACCELERATE_"))
    }
    env.update(
        HPSE_CACHE_DIR=str(tmp_path / "cache"),
        HPSE_DATA_DIR=str(DATA_DIR),
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
        HF_HOME=str(tmp_path / "hf"),
        HF_HUB_OFFLINE="1",
        TMPDIR=str(tmp_path),  # torchrun's own temporary files stay in the test's directory
    )
    return env


@needs_data
def test_two_processes_match_one_and_a_killed_process_resumes(tiny, reference, tmp_path):
    ref_out, ref_summary, ref_records = reference
    out = tmp_path / "dist"
    rank1 = out / "results.rank1-of-2.jsonl"
    log_path = (
        tmp_path / "killed-launch.log"
    )  # a file, not a pipe: nobody reads while the test polls
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            _launch_cmd(tiny, out, _free_port()),
            env=_env(tmp_path),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.time() + 150
        while time.time() < deadline and proc.poll() is None:
            if rank1.is_file() and rank1.read_bytes().count(b"\n") >= 1:
                break
            time.sleep(0.01)
        victim = _rank_pid(proc.pid, 1)
        assert proc.poll() is None and victim is not None, (
            "the run finished before a process could be killed"
        )
        os.kill(victim, signal.SIGKILL)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0, log_path.read_text(errors="replace")[
        -3000:
    ]  # the launcher stops the other process too
    kept = {p.name: p.read_bytes() for p in out.glob("results*.jsonl")}
    assert 1 <= kept[rank1.name].count(b"\n") < 3, (
        kept
    )  # rank 1 was killed in the middle of its 3 cases
    assert not (out / "summary.json").exists()  # nothing summarised from a partial run
    with open(rank1, "ab") as fh:  # as if the kill had landed in the middle of writing a line
        fh.write(b'{"case_id": "99", "Ind": ')

    again = subprocess.Popen(
        _launch_cmd(tiny, out, _free_port()),
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = again.communicate(timeout=300)
    finally:
        if (
            again.poll() is None
        ):  # the launcher and its workers: the process group this test started
            os.killpg(again.pid, signal.SIGKILL)
    assert again.returncode == 0, (stdout + stderr)[-3000:]
    assert stdout.count("| method | Ind | Cmp | Avg |") == 1  # printed by the main process only
    for name, before in kept.items():  # what was written before the kill is untouched
        assert (out / name).read_bytes().startswith(before)
    ids = [str(r["case_id"]) for r in ref_records]
    shard0, shard1 = _lines(out / "results.rank0-of-2.jsonl"), _lines(rank1)
    assert [str(r["case_id"]) for r in shard0] == ids[
        0::2
    ]  # every 2nd case from rank 0, exactly once
    assert [str(r["case_id"]) for r in shard1] == ids[1::2]
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "environments.jsonl",
        "results.rank0-of-2.jsonl",
        "results.rank1-of-2.jsonl",
        "summary.json",
        "table.md",
    ]
    envs = [json.loads(line) for line in (out / "environments.jsonl").read_text().splitlines()]
    for rank, shard in (
        (0, ids[0::2]),
        (1, ids[1::2]),
    ):  # each process, in each launch, named the cases it took on
        taken = [c for e in envs if (e["rank"], e["world"]) == (rank, 2) for c in e["cases"]]
        assert set(taken) == set(shard), (rank, envs)
    assert sum(e["rank"] == 1 for e in envs) == 2  # rank 1 ran twice: killed, then resumed
    assert _by_id(shard0 + shard1) == _by_id(
        ref_records
    )  # answers, scores, per-round losses: identical
    summary = json.loads((out / "summary.json").read_text())
    assert _strip(summary) == _strip(ref_summary)
    assert (out / "table.md").read_text() == (ref_out / "table.md").read_text()
    assert (out / "config.json").read_text() == (ref_out / "config.json").read_text()


# ----------------------------------------------------------------------------------- shards by hand
@needs_data
def test_continual_editing_shards_whole_blocks_and_merges_exactly(tiny, tmp_path, one_thread):
    ref = run_benchmark(_opts(tiny, tmp_path / "ref", sequential=2))
    ref_records = _lines(tmp_path / "ref" / "results.jsonl")
    out = tmp_path / "seq"
    with pytest.raises(
        IncompleteRunError, match="2 of 6 case\\(s\\) have no result.*Rerun the same command"
    ):
        run_benchmark(_opts(tiny, out, sequential=2), ProcessContext(rank=0, world=2))
    assert not (out / "summary.json").exists()
    summary = run_benchmark(_opts(tiny, out, sequential=2), ProcessContext(rank=1, world=2))
    assert not (
        out / "summary.json"
    ).exists()  # the others compute it, only the main process writes it
    blocks0 = [r["block"] for r in _lines(out / "results.rank0-of-2.jsonl")]
    blocks1 = [r["block"] for r in _lines(out / "results.rank1-of-2.jsonl")]
    assert blocks0 == [0, 0, 2, 2] and blocks1 == [1, 1]  # a block of T never spans processes
    assert _by_id(
        _lines(out / "results.rank0-of-2.jsonl") + _lines(out / "results.rank1-of-2.jsonl")
    ) == _by_id(ref_records)
    assert _strip(summary) == _strip(ref)
    again = run_benchmark(
        _opts(tiny, out, sequential=2), ProcessContext(rank=0, world=2)
    )  # the main process, once all is there
    assert _strip(json.loads((out / "summary.json").read_text())) == _strip(ref) == _strip(again)


@needs_data
def test_rerun_with_another_process_count_and_duplicate_refusal(
    tiny, reference, tmp_path, one_thread
):
    _, ref_summary, ref_records = reference
    out = tmp_path / "mixed"
    for rank, missing in (
        (0, 4),
        (1, 2),
    ):  # 2 of 3 shards of a 3-process layout; the third never ran
        with pytest.raises(IncompleteRunError, match=f"{missing} of 6 case"):
            run_benchmark(_opts(tiny, out), ProcessContext(rank=rank, world=3))
    # rerun as ONE process: only the two missing cases run, into results.jsonl; the old shards are
    # kept
    summary = run_benchmark(_opts(tiny, out))
    assert [r["case_id"] for r in _lines(out / "results.jsonl")] == [
        ref_records[2]["case_id"],
        ref_records[5]["case_id"],
    ]
    assert _strip(summary) == _strip(ref_summary)
    merged = sum((_lines(p) for p in sorted(out.glob("results*.jsonl"))), [])
    assert len(merged) == 6 and _by_id(merged) == _by_id(ref_records)
    # and as 2 processes: everything is done already, so nothing runs and the summary is the same
    assert _strip(run_benchmark(_opts(tiny, out), ProcessContext(rank=1, world=2))) == _strip(
        ref_summary
    )
    assert not (out / "results.rank1-of-2.jsonl").exists()
    # a case recorded in two files is refused before anything runs or is summarised
    line = (out / "results.rank0-of-3.jsonl").read_text().splitlines()[0]
    with open(out / "results.jsonl", "a") as fh:
        fh.write(line + "\n")
    with pytest.raises(
        IncompleteRunError,
        match="recorded twice, in results.jsonl and results.rank0-of-3.jsonl|"
        "recorded twice, in results.rank0-of-3.jsonl and results.jsonl",
    ):
        run_benchmark(_opts(tiny, out))


@needs_data
def test_non_main_process_needs_the_main_process_config(tiny, tmp_path):
    with pytest.raises(
        ConfigMismatchError, match="config.json is missing.*filesystem every host sees"
    ):
        run_benchmark(_opts(tiny, tmp_path / "fresh"), ProcessContext(rank=1, world=2))


# --------------------------------------------------------------------------- run directory identity
@needs_data
def test_old_run_directory_without_a_new_field_resumes_but_real_changes_are_refused(tiny, tmp_path):
    out = tmp_path / "old"
    run_benchmark(_opts(tiny, out, limit=1))
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    # as written by code from before `batched_rollout` existed, on another GPU
    del config["hparams"]["batched_rollout"]
    config["hparams"]["device"] = 3
    config_path.write_text(json.dumps(config))
    summary = run_benchmark(
        _opts(tiny, out, limit=2)
    )  # resumes: the field is at its default, device is placement
    assert summary["n_cases"] == 2 and len(_lines(out / "results.jsonl")) == 2
    pinned = json.loads(config_path.read_text())
    assert pinned["hparams"]["batched_rollout"] is True and pinned["hparams"]["device"] == 3
    del pinned["hparams"]["batched_rollout"]
    config_path.write_text(json.dumps(pinned))
    with pytest.raises(ConfigMismatchError, match="hparams.batched_rollout: '<missing>' -> False"):
        run_benchmark(_opts(tiny, out, limit=2, overrides=["batched_rollout=false"]))
    with pytest.raises(ConfigMismatchError, match="hparams.kl_weight: 1.0 -> 0.0"):
        run_benchmark(_opts(tiny, out, limit=2, overrides=["kl_weight=0"]))
    assert len(_lines(out / "results.jsonl")) == 2


def test_config_policy_placement_and_defaults():
    policy = config_policy(tiny_hparams())
    assert policy.ignored(("hparams", "device")) and policy.ignored(("hparams", "model_parallel"))
    assert not policy.ignored(("hparams", "lr")) and not policy.ignored(("max_new_tokens",))
    assert policy.new_default(("hparams", "seed"), 0) and policy.new_default(
        ("hparams", "chat_template_kwargs"), {}
    )
    assert not policy.new_default(("hparams", "seed"), 1)
    assert not policy.new_default(("hparams", "not_a_field"), None)
    assert not policy.new_default(("max_new_tokens",), 96)  # only hparams fields
    assert not policy.new_default(
        ("hparams", "chat_template_kwargs", "seed"), 0
    )  # nested keys are values, not fields


def test_benchmark_scoped_overrides_of_run_compare():
    from benchmarks.analysis.compare import overrides_for, parse_method

    label, path, overrides = parse_method(
        ["HPSE", "x.yaml", "rounds=3", "unkebench:max_new_tokens=128", "device=cuda:1"]
    )
    assert overrides_for(overrides, "unkebench") == [
        "rounds=3",
        "max_new_tokens=128",
        "device=cuda:1",
    ]
    assert overrides_for(overrides, "mquake-uns") == ["rounds=3", "device=cuda:1"]
    with pytest.raises(argparse.ArgumentTypeError, match="names no benchmark"):
        parse_method(["HPSE", "x.yaml", "unke:max_new_tokens=128"])


# ----------------------------------------------------------------------------------- process layout
def test_shards_and_gpu_groups():
    units = list(range(7))
    shards = [ProcessContext(rank=r, world=3).shard(units) for r in range(3)]
    assert shards == [[0, 3, 6], [1, 4], [2, 5]]
    assert ProcessContext(rank=1, world=3).shard(list(range(4))) == [
        1
    ]  # a larger --limit never moves a unit
    assert ProcessContext(rank=5, world=8).shard(units[:3]) == []
    gpus = [str(i) for i in range(8)]
    assert [gpu_group(gpus, r, 4) for r in range(4)] == [
        ["0", "1"],
        ["2", "3"],
        ["4", "5"],
        ["6", "7"],
    ]
    assert gpu_group(["3", "5"], 1, 2) == ["5"]
    with pytest.raises(LaunchError, match="cannot be split evenly"):
        gpu_group(gpus[:3], 0, 2)
    with pytest.raises(LaunchError, match="none is visible"):
        gpu_group([], 0, 2)
    with pytest.raises(ValueError, match="rank must be in"):
        ProcessContext(rank=2, world=2)


def test_model_parallel_process_claims_its_gpu_group_before_cuda_starts(monkeypatch):
    """The CUDA_VISIBLE_DEVICES hand-out, with torch.cuda stood in for (this machine has no GPU)."""
    from benchmarks.run import distributed

    started = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: bool(started))
    monkeypatch.setattr(
        torch.cuda, "init", lambda: started.append(os.environ["CUDA_VISIBLE_DEVICES"])
    )
    monkeypatch.setattr(
        torch.cuda, "device_count", lambda: len(os.environ["CUDA_VISIBLE_DEVICES"].split(","))
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert (
        distributed._claim_gpu_group() == ("4", "5") and os.environ["CUDA_VISIBLE_DEVICES"] == "4,5"
    )
    assert started == ["4,5"]  # the limit was set before CUDA started
    with pytest.raises(LaunchError, match="already started"):
        distributed._claim_gpu_group()
    started.clear()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    monkeypatch.setattr(
        torch.cuda, "device_count", lambda: 8
    )  # a driver that started before the limit
    with pytest.raises(LaunchError, match="still sees 8"):
        distributed._claim_gpu_group()


# ------------------------------------------------------------------------- stale launcher variables
@pytest.mark.parametrize(
    "env, fragment",
    [
        ({"RANK": "3", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}, "RANK=3 but WORLD_SIZE=2"),
        ({"RANK": "1", "WORLD_SIZE": "2"}, "MASTER_ADDR (where the processes meet) is not"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not a process count"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "RANK=0 but WORLD_SIZE=0"),
        ({"LOCAL_RANK": "4", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK=4 but LOCAL_WORLD_SIZE=2"),
    ],
)
def test_launcher_variables_no_launch_could_set_are_one_line(env, fragment):
    with pytest.raises(LaunchError, match=re.escape(fragment)) as info:
        check_launch_environment(env)
    assert "left over from another launch" in str(info.value)


def test_launcher_variables_of_a_real_launch_pass():
    check_launch_environment({})
    check_launch_environment({"RANK": "0", "WORLD_SIZE": "1"})
    check_launch_environment(
        {
            "RANK": "1",
            "WORLD_SIZE": "2",
            "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500",
        }
    )


@needs_data
@pytest.mark.parametrize("stale", ["rank beyond the world", "no peers come"])
def test_a_runner_with_stale_launcher_variables_ends_in_one_line(tiny, tmp_path, stale):
    """``RANK=3 WORLD_SIZE=2`` is refused before anything starts; ``RANK=1 WORLD_SIZE=2`` with a
    MASTER_ADDR where nobody listens waits HPSE_DIST_START_TIMEOUT seconds for its peers, then
    says so: both exit 2 with one line, where they used to wait silently."""
    env = _env(tmp_path)
    rank = "3" if stale == "rank beyond the world" else "1"
    env.update(
        RANK=rank,
        WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        HPSE_DIST_START_TIMEOUT="3",
    )
    cmd = [
        sys.executable,
        str(REPO / "run_examples" / "run_hpse_mquake.py"),
        "--hparams",
        str(tiny / "hpse.yaml"),
        "--limit",
        "1",
        "--judge",
        "lexical",
        "--out",
        str(tmp_path / "out"),
        "--log-level",
        "WARNING",
    ]
    start = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    errors = [x for x in done.stderr.splitlines() if "error" in x.lower()]
    assert done.returncode == 2 and len(errors) == 1, done.stderr[-2000:]
    if stale == "rank beyond the world":
        assert "RANK=3 but WORLD_SIZE=2" in errors[0]
    else:
        assert "process 1 of 2 waited 3 s at 127.0.0.1:" in errors[0]
        assert "HPSE_DIST_START_TIMEOUT" in errors[0]
    assert time.monotonic() - start < 120
    assert not (tmp_path / "out" / "results.jsonl").exists()


# ------------------------------------------------------------------------------------ devices
@needs_data
def test_resume_with_model_parallel_on_cpu_is_the_same_run(tiny, reference, tmp_path, one_thread):
    """model_parallel is placement: a run may be resumed with it switched on (device_map='auto'; the
    CPU here)."""
    import shutil

    ref_out, ref_summary, ref_records = reference
    out = tmp_path / "mp"
    shutil.copytree(ref_out, out)
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ref_records[:4]))
    (out / "summary.json").unlink()
    summary = run_benchmark(_opts(tiny, out, overrides=["model_parallel=true"]))
    assert _by_id(_lines(out / "results.jsonl")) == _by_id(ref_records)
    assert (
        json.loads((out / "config.json").read_text())["hparams"]["model_parallel"] is False
    )  # as recorded
    differs = {
        "hparams": None,
        "label": None,
    }  # the requested hparams and the default label name the override
    assert _strip({**summary, **differs}) == _strip({**ref_summary, **differs})


def test_offloaded_placement_is_refused():
    """The runner refuses an offloaded placement with the loader's own check
    (``loading.check_placement``)."""
    from types import SimpleNamespace

    from hpse_easyedit.hparams import HParamsError
    from hpse_easyedit.loading import check_placement

    check_placement(SimpleNamespace(hf_device_map={"model.layers.0": 0, "model.layers.1": 1}))
    check_placement(SimpleNamespace(hf_device_map={"": "cpu"}))
    check_placement(SimpleNamespace())
    with pytest.raises(HParamsError, match="offloaded 1 module.*first: lm_head.*larger GPUs"):
        check_placement(SimpleNamespace(hf_device_map={"model.layers.0": 0, "lm_head": "cpu"}))
    with pytest.raises(HParamsError, match="offloaded 1 module.*first: lm_head"):
        check_placement(SimpleNamespace(hf_device_map={"model": 0, "lm_head": "disk"}))


def _edit_trace(model, tok, hp):
    """Per-round statistics of one edit, the trained tensors after it, and a greedy answer."""
    from hpse_easyedit import generate_answers, hpse_edit

    req = [
        {"subject": "AJ Lee", "target_new": "AJ Lee speaks Russian fluently and lives in Moscow."}
    ]
    res = hpse_edit(model, tok, req, hp)
    stats = [{k: v for k, v in r.items() if "seconds" not in k} for r in res.rounds]
    trained = {
        n: p.detach().cpu().clone()
        for n, p in res.model.named_parameters()
        if "lora_" in n or n.endswith(f"layers.{hp.ftm_layer}.mlp.down_proj.weight")
    }
    answer = generate_answers(res.model, tok, ["Where does AJ Lee live?"], max_new_tokens=5)
    return stats, trained, answer


@pytest.mark.parametrize(
    "executor,batched", [("lora", True), ("lora", False), ("ft_m", True), ("ft_m", False)]
)
def test_edit_through_accelerate_dispatch_hooks_matches_plain_model(
    tmp_path, executor, batched, one_thread, gate_always_open
):
    """device_map dispatch on the CPU: accelerate's hooks move every layer's inputs and outputs, as
    across GPUs."""
    from accelerate import dispatch_model
    from transformers import AutoModelForCausalLM

    from benchmarks.tasks.datasets import MMLUItem
    from benchmarks.tasks.mmlu import letter_scores

    make_tiny_model_and_tokenizer("llama", tmp_path / "m", init_std=0.2)
    hp = tiny_hparams(
        executor=executor,
        batched_rollout=batched,
        tau=-100.0,
        kappa=0.0,
        inner_steps=2,
        max_new_tokens=6,
    )
    _, tok = make_tiny_model_and_tokenizer("llama", init_std=0.2)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()
    hooked = AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()
    device_map = {
        "model.embed_tokens": "cpu",
        "model.rotary_emb": "cpu",
        "model.layers.0": "cpu",
        "model.layers.1": "cpu",
        "model.norm": "cpu",
        "lm_head": "cpu",
    }
    hooked = dispatch_model(hooked, device_map=device_map, force_hooks=True)
    assert hasattr(hooked.model.layers[1], "_hf_hook")  # the hooks are really there
    item = MMLUItem(subject="x", question="Q?", choices=["a", "b", "c", "d"], answer=0, shots=[])
    assert letter_scores(plain, tok, [item]) == letter_scores(hooked, tok, [item])
    expected, got = _edit_trace(plain, tok, hp), _edit_trace(hooked, tok, hp)
    assert got[0] == expected[0] and got[2] == expected[2]
    assert all(
        r["stepin_rate"] == 1.0 for r in got[0]
    )  # tau=-100, kappa=0: the teacher path runs at every token
    assert got[1].keys() == expected[1].keys() and all(
        torch.equal(got[1][k], expected[1][k]) for k in got[1]
    )


@pytest.mark.skipif(
    torch.cuda.device_count() < 2,
    reason="needs 2 GPUs to place a model across two devices; "
    f"this machine has {torch.cuda.device_count()}",
)
@pytest.mark.parametrize("executor", ["lora", "ft_m"])
def test_model_split_across_two_gpus(tmp_path, executor, gate_always_open):
    from transformers import AutoModelForCausalLM

    from hpse_easyedit import load_model
    from hpse_easyedit.loading import check_placement

    make_tiny_model_and_tokenizer("llama", tmp_path / "m", init_std=0.2)
    _, tok = make_tiny_model_and_tokenizer("llama", init_std=0.2)
    hp = tiny_hparams(executor=executor, tau=-100.0, kappa=0.0)
    split = AutoModelForCausalLM.from_pretrained(
        tmp_path / "m",
        device_map={
            "model.embed_tokens": 0,
            "model.rotary_emb": 0,
            "model.layers.0": 0,
            "model.layers.1": 1,
            "model.norm": 1,
            "lm_head": 1,
        },
    ).eval()
    single = AutoModelForCausalLM.from_pretrained(tmp_path / "m").to("cuda:0").eval()
    assert split.model.layers[1].mlp.down_proj.weight.device == torch.device("cuda:1")
    got, expected = _edit_trace(split, tok, hp), _edit_trace(single, tok, hp)
    assert len(got[0]) == len(expected[0])
    for g, e in zip(got[0], expected[0]):
        assert g.keys() == e.keys()
        for k in g:
            assert g[k] == (
                pytest.approx(e[k], rel=1e-3, abs=1e-4) if isinstance(e[k], float) else e[k]
            ), k
    model, _ = load_model(tiny_hparams(model_name=str(tmp_path / "m"), model_parallel=True))
    assert hasattr(model, "hf_device_map")
    check_placement(model)
