"""Fault injection: SIGKILL at random points, a full disk at every write point, two writers at once,
Ctrl-C at every stage, SIGTERM and SIGHUP, a kill inside a snapshot write or a --save, a closed
stdout, a damaged results line, two threads editing one model, a downloaded edit folder asking for
remote code. After each fault the same command finishes the run: every case exactly once, the
records and the summary equal to an uninterrupted run's, nothing a user produced lost.
docs/BENCHMARKS.md reports the counts."""

import errno
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from bench_helpers import DATA_DIR, isolate_judge_env
from benchmarks.records import store as store_module
from benchmarks.run import run_dir as run_dir_module
from benchmarks.run import summary as summary_module
from benchmarks.run.case_loop import Editing, SequentialLoop
from benchmarks.run.cli import cli_main
from benchmarks.run.runner import RunOptions, run_benchmark
from benchmarks.run.scorer import Scorer
from benchmarks.run.summary import RunSummary
from benchmarks.tasks import mmlu as mmlu_module
from hpse_easyedit import HPSEHyperParams
from hpse_easyedit import cli as edit_cli
from hpse_easyedit.errors import UsageError
from hpse_easyedit.executors import EXECUTORS
from tiny_models import make_tiny_model_and_tokenizer

# the slow tier (`make test`, not `make test-fast`): subprocesses killed, interrupted and resumed
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
needs_data = pytest.mark.skipif(
    not DATA_DIR.is_dir(), reason="needs ../shared/data next to the repository"
)

# fast_decode false: "auto" times two kernels once per process, and the resumed processes must
# compute what the uninterrupted one did, bit for bit
HPARAMS = (
    "alg_name: HPSE\nmodel_name: {model}\nrounds: 2\ninner_steps: "
    "2\nmax_new_tokens: 6\nlr: 1.0e-2\nfast_decode: false\n"
)
MODES = {"single": [], "sequential": ["--sequential", "3", "--checkpoints", "1,2"]}


@pytest.fixture(scope="module")
def tiny_files(tiny_model):
    return {"hpse.yaml": HPARAMS.format(model=tiny_model)}


def _isolate(monkeypatch, tmp_path):
    """No judge, no waiting on a full disk, and the system's temporary directory (where records or
    an edit that could not be written are saved whole) inside the test's own: nothing is left in
    /tmp."""
    isolate_judge_env(monkeypatch, tmp_path)
    monkeypatch.setenv("HPSE_DISK_FULL_WAIT", "0")
    aside = tmp_path / "tmp"
    aside.mkdir(exist_ok=True)
    monkeypatch.setattr(tempfile, "tempdir", str(aside))


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    _isolate(monkeypatch, tmp_path)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Every run here computes on one thread, in this process as in the ones it starts (``_env``):
    another thread count sums in another order, and a sequence of edits carries the last bits into
    its answers."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _args(tiny, out, mode):
    return [
        "--hparams",
        str(tiny / "hpse.yaml"),
        "--data",
        str(DATA_DIR),
        "--limit",
        "3",
        "--max-new-tokens",
        "5",
        "--out",
        str(out),
        "--log-level",
        "WARNING",
        *MODES[mode],
    ]


def _opts(tiny, out, mode):
    seq = dict(sequential=3, checkpoints=[1, 2]) if mode == "sequential" else {}
    return RunOptions(
        benchmark="mquake-uns",
        hparams=str(tiny / "hpse.yaml"),
        data_dir=str(DATA_DIR),
        limit=3,
        max_new_tokens=5,
        out_dir=str(out),
        **seq,
    )


def _strip(value):
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if "seconds" not in k and k != "out_dir"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _outcome(out):
    """What a finished run directory holds, timing fields and its own path aside."""
    files = {}
    for name in ("results.jsonl", "checkpoints.jsonl"):
        path = out / name
        if path.is_file():
            files[name] = sorted(
                (_strip(json.loads(x)) for x in path.read_text().splitlines()),
                key=lambda r: (r.get("checkpoint", 0), str(r["case_id"])),
            )
    files["summary"] = _strip(json.loads((out / "summary.json").read_text()))
    return files


@pytest.fixture(scope="module")
def reference(tiny, tmp_path_factory):
    """The uninterrupted run of each mode (on one thread: ``_one_thread``)."""
    root = tmp_path_factory.mktemp("reference")
    outcomes = {}
    for mode in MODES:
        run_benchmark(_opts(tiny, root / mode, mode))
        outcomes[mode] = _outcome(root / mode)
    return outcomes


def _env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "HPSE_JUDGE_"))}
    env.update(HPSE_CACHE_DIR=str(tmp_path / "cache"), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return env


def _cmd(tiny, out, mode):
    return [
        sys.executable,
        str(REPO / "run_examples" / "run_hpse_mquake.py"),
        *_args(tiny, out, mode),
    ]


# ------------------------------------------------------------------------------------------ SIGKILL
def _own_progress_bar_lock() -> None:
    """Give this (forked) process a tqdm write lock of its own. tqdm's default lock holds a
    multiprocessing semaphore that a forked child shares with its parent: a child killed while it
    writes a progress bar leaves the semaphore taken, and the parent's next progress bar (a later
    test in the same pytest worker) would wait for it forever."""
    import threading

    from tqdm import std as tqdm_std

    lock, classes = threading.RLock(), [tqdm_std.tqdm]
    while classes:
        cls = classes.pop()
        if cls is tqdm_std.tqdm or "_lock" in vars(cls):
            cls.set_lock(lock)
        classes.extend(cls.__subclasses__())


def _forked_run(tiny, out, mode, tmp_path) -> int:
    """The run of ``_cmd(tiny, out, mode)`` in a child forked from this process (``cli_main``, the
    script's own entry point, with ``_env``'s environment and its output thrown away): the modules
    are imported already, so a kill lands in the run itself rather than in an interpreter's start
    (about 5 s of imports per process here). Returns the child's pid."""
    import logging

    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:  # the child: never back into pytest, whatever happens
        _own_progress_bar_lock()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM):
            signal.signal(
                sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL
            )
        os.environ.clear()
        os.environ.update(_env(tmp_path))
        logging.root.handlers.clear()  # pytest's capture handlers are this process's
        code = cli_main("mquake-uns", _args(tiny, out, mode))
    finally:
        os._exit(code)


def _wait(pid: int, seconds: float) -> bool:
    """Whether the child ``pid`` ended within ``seconds`` (reaped then)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0]:
            return True
        time.sleep(0.01)
    return False


def test_a_forked_run_killed_while_writing_a_progress_bar_leaves_the_parents_bars_usable():
    from tqdm import std as tqdm_std

    tqdm_std.tqdm.get_lock()  # the default lock and its shared semaphore exist before the fork
    pid = os.fork()
    if not pid:  # the child takes the lock as a progress bar's write does, and is killed holding it
        try:
            _own_progress_bar_lock()
            tqdm_std.tqdm.get_lock().acquire()
            os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(1)
    os.waitpid(pid, 0)
    shared = tqdm_std.TqdmDefaultWriteLock.mp_lock
    assert shared.acquire(timeout=5), "the killed child left tqdm's shared semaphore taken"
    shared.release()


@needs_data
@pytest.mark.parametrize("mode", list(MODES))
def test_sigkill_at_random_points_then_resume(tiny, tmp_path, reference, mode):
    """Ten kills per mode, each at a random moment of a process that resumes what the killed one
    left (each process forked with the modules imported, ``_forked_run``, so that every kill lands
    in the run); then the same command, a new process, finishes it. The moments are drawn within
    the time one uninterrupted process of the run takes on this host, timed first (from well under
    a second to several on the hosts seen), so that the kills land across the whole run on any
    host rather than mostly after it ended."""
    timed = tmp_path / "timed"
    start = time.monotonic()
    os.waitpid(_forked_run(tiny, timed, mode, tmp_path), 0)
    span = time.monotonic() - start
    assert _outcome(timed) == reference[mode]
    rng = random.Random(f"kill-{mode}")
    out, kills, started = tmp_path / "run", 0, 0
    while kills < 10 and started < 40:
        pid = _forked_run(tiny, out, mode, tmp_path)
        started += 1
        if not _wait(pid, rng.uniform(0.02, span)):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            kills += 1
            continue
        if (
            out / "summary.json"
        ).is_file():  # the run finished before its kill: start the chain again
            out = tmp_path / f"run{started}"
    assert kills == 10
    done = subprocess.run(
        _cmd(tiny, out, mode), env=_env(tmp_path), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert _outcome(out) == reference[mode]


# ---------------------------------------------------------------------------------------- full disk
#: where a run writes a whole file (config.json, mmlu_before.json, summary.json, table.md): every
#: module's name
WHOLE_FILE_WRITERS = [
    (store_module, "write_json_atomic"),
    (mmlu_module, "write_json_atomic"),
    (summary_module, "write_json_atomic"),
    (summary_module, "write_text_atomic"),
]


def _full_disk_once(monkeypatch, target, attr, at):
    """The ``at``-th call of ``target.attr`` (for ``"whole files"``: of any whole-file writer) fails
    with ENOSPC after writing nothing; returns the call counter."""
    calls = [0]
    for tgt, name in WHOLE_FILE_WRITERS if attr == "whole files" else [(target, attr)]:
        # the default binds this iteration's original writer (a closure would see the last one)
        def failing(*args, _real=getattr(tgt, name), **kwargs):  # noqa: B008
            calls[0] += 1
            if calls[0] == at:
                raise OSError(errno.ENOSPC, "No space left on device", "injected")
            return _real(*args, **kwargs)

        monkeypatch.setattr(tgt, name, failing)
    return calls


def _count_calls(monkeypatch, tiny, tmp_path, points, mode):
    """How often an uninterrupted run calls each of ``points`` ((target, attr) as
    ``_full_disk_once`` takes them): one run, every point counted (none fails)."""
    calls = {point: _full_disk_once(monkeypatch, *point, at=0) for point in points}
    run_benchmark(_opts(tiny, tmp_path / "count", mode))
    monkeypatch.undo()
    _isolate(monkeypatch, tmp_path)
    return {point: n[0] for point, n in calls.items()}


@needs_data
@pytest.mark.parametrize("mode", list(MODES))
def test_a_full_disk_at_every_write_point_loses_no_case(
    tiny, tmp_path, reference, monkeypatch, mode
):
    """Every append (results, sequence, checkpoints) and every whole-file write (config, MMLU,
    summary) fails once in its own run; the run stops with one line, the finished records are saved
    whole elsewhere, and the same command finishes the run as if nothing had happened."""
    points = _count_calls(
        monkeypatch,
        tiny,
        tmp_path,
        [(store_module.ResultFile, "append"), (None, "whole files")],
        mode,
    )
    assert points[(store_module.ResultFile, "append")] >= 3 and points[(None, "whole files")] == 3
    tried = 0
    for (target, attr), n in points.items():
        for at in range(1, n + 1):
            out = tmp_path / f"{attr}-{at}"
            _full_disk_once(monkeypatch, target, attr, at)
            with pytest.raises((UsageError, OSError)) as info:
                run_benchmark(_opts(tiny, out, mode))
            if isinstance(info.value, UsageError):  # an append: its records were kept
                assert "finished record(s) were saved whole to" in str(info.value)
                kept = Path(str(info.value).split("saved whole to ")[1].split(":")[0])
                assert kept.is_file() and kept.read_text().count("\n") >= 1
                assert kept.parent == tmp_path / "tmp"
            monkeypatch.undo()
            _isolate(monkeypatch, tmp_path)
            run_benchmark(_opts(tiny, out, mode))
            assert _outcome(out) == reference[mode], (attr, at)
            tried += 1
    assert tried == sum(points.values())


@needs_data
def test_a_full_disk_that_is_freed_while_the_run_waits_costs_nothing(
    tiny, tmp_path, reference, monkeypatch
):
    monkeypatch.setenv("HPSE_DISK_FULL_WAIT", "1")
    monkeypatch.setattr(run_dir_module.time, "sleep", lambda s: None)
    _full_disk_once(monkeypatch, store_module.ResultFile, "append", at=2)
    run_benchmark(_opts(tiny, tmp_path / "run", "single"))
    assert _outcome(tmp_path / "run") == reference["single"]


@pytest.mark.parametrize("point", ["save_edit", "to_yaml", "write_text"])
def test_save_on_a_full_disk_keeps_the_edit_whole_elsewhere(
    tiny, tmp_path, monkeypatch, capsys, point
):
    passage = tmp_path / "passage.txt"
    passage.write_text("Selma Varrick is a marine biologist born in Norway.")
    target = {
        "save_edit": (EXECUTORS["lora"], "save_edit"),
        "to_yaml": (HPSEHyperParams, "to_yaml"),
        "write_text": (Path, "write_text"),
    }[point]
    calls = _full_disk_once(monkeypatch, *target, at=1)
    if (
        point == "write_text"
    ):  # only edit.json's write: the check before the model loads writes a probe file
        calls[0] = 0
    save = tmp_path / "saved"
    capsys.readouterr()
    code = edit_cli.main(
        [
            "edit",
            "--hparams",
            str(tiny / "hpse.yaml"),
            "--subject",
            "Selma Varrick",
            "--passage-file",
            str(passage),
            "--save",
            str(save),
            "--max-answer-tokens",
            "2",
        ]
    )
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error")]
    assert code == 2 and len(err) == 1 and "the edit was saved whole to" in err[0]
    fallback = Path(err[0].split("saved whole to ")[1].split(" instead")[0])
    assert fallback.parent == tmp_path / "tmp"
    assert sorted(p.name for p in fallback.iterdir()) == ["adapter", "edit.json", "hparams.yaml"]
    assert not list(save.iterdir())  # nothing half-written; the same command may save there again


def _one_line(caplog, capsys, prefix):
    """The one line a CLI entry point said (through the run's log handler, or printed when it has
    none)."""
    said = [
        f"{r.hpse_one_line}: {r.getMessage()}"
        for r in caplog.records
        if getattr(r, "hpse_one_line", None)
    ]
    said += [x for x in capsys.readouterr().err.splitlines() if x.startswith(prefix + ":")]
    assert len(said) == 1, said
    return said[0]


@needs_data
def test_an_unwritable_out_is_one_line_before_the_model_loads(
    tiny, tmp_path, caplog, capsys, monkeypatch
):
    loaded = []
    monkeypatch.setattr(Editing, "ensure_model", lambda self: loaded.append(1))
    unwritable = Path("/sys/hpse-faults")  # even root cannot create a directory in sysfs
    assert cli_main("mquake-uns", _args(tiny, unwritable / "run", "single")) == 2
    assert f"error: --out {unwritable / 'run'}: cannot write there" in _one_line(
        caplog, capsys, "error"
    )
    assert not loaded


# -------------------------------------------------------------------------------------- two writers
@needs_data
def test_a_second_run_into_the_same_directory_stops_at_once(tiny, tmp_path, caplog, capsys):
    out = tmp_path / "run"
    first = subprocess.Popen(
        _cmd(tiny, out, "single"),
        env=_env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 120
        while not (out / "config.json").is_file() and time.time() < deadline:
            time.sleep(0.05)
        # the first run is held mid-run (stopped: it keeps its writer lock) while the second, the
        # same command's entry point in this process, starts; it then goes on and finishes its cases
        first.send_signal(signal.SIGSTOP)
        try:
            code = cli_main("mquake-uns", _args(tiny, out, "single"))
            still_editing = first.poll() is None
        finally:
            first.send_signal(signal.SIGCONT)
        assert first.wait(timeout=600) == 0 and still_editing
    finally:
        if first.poll() is None:
            first.kill()
    assert code == 2
    assert f"process {first.pid} is writing into this directory" in _one_line(
        caplog, capsys, "error"
    )
    ids = [json.loads(x)["case_id"] for x in (out / "results.jsonl").read_text().splitlines()]
    assert (
        len(ids) == len(set(ids)) == 3
        and json.loads((out / "summary.json").read_text())["n_cases"] == 3
    )


# ------------------------------------------------------------------------------------------- Ctrl-C
STAGES = [
    (Editing, "ensure_model", 1),
    (Editing, "edit", 1),
    (Editing, "edit", 3),
    (Editing, "answers", 1),
    (Editing, "answers", 2),
    (Scorer, "score", 2),
    (SequentialLoop, "checkpoint", 2),
    (RunSummary, "build", 1),
]


@needs_data
@pytest.mark.parametrize("mode", list(MODES))
def test_ctrl_c_at_every_stage_is_one_line_and_the_same_command_resumes(
    tiny, tmp_path, reference, monkeypatch, caplog, capsys, mode
):
    tried = 0
    for stage_class, stage, at in STAGES:
        out = tmp_path / f"{stage}-{at}"
        real, calls = getattr(stage_class, stage), [0]

        def interrupted(self, *args, _real=real, _calls=calls, _at=at, **kwargs):
            _calls[0] += 1
            if _calls[0] == _at:
                raise KeyboardInterrupt
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(stage_class, stage, interrupted)
        caplog.clear()
        capsys.readouterr()
        code = cli_main("mquake-uns", _args(tiny, out, mode))
        monkeypatch.undo()
        _isolate(monkeypatch, tmp_path)
        if (
            not calls[0] >= at
        ):  # a stage this mode does not reach that often (single mode has no checkpoint)
            continue
        said = _one_line(caplog, capsys, "interrupted")
        assert (
            code == 130
            and said.startswith("interrupted: ")
            and "run the same command again" in said
        )
        assert cli_main("mquake-uns", _args(tiny, out, mode)) == 0
        assert _outcome(out) == reference[mode], (stage, at)
        tried += 1
    assert tried == len([s for s in STAGES if mode == "sequential" or s[1] != "checkpoint"])


# ------------------------------------------------------------------- SIGTERM, a kill inside a write
@needs_data
def test_sigterm_is_one_line_saying_what_is_kept_and_the_same_command_resumes(
    tiny, tmp_path, reference
):
    """A job scheduler's SIGTERM used to end the run in 0.1 s without a word."""
    out = tmp_path / "run"
    proc = subprocess.Popen(
        _cmd(tiny, out, "single"),
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.time() + 300
    while not (out / "results.jsonl").is_file() and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    said = [
        x
        for x in stderr.decode().splitlines()
        if x.startswith(("interrupted", "error", "Traceback"))
    ]
    assert proc.returncode == 128 + signal.SIGTERM and len(said) == 1, stderr.decode()[-2000:]
    assert said[0].startswith("interrupted: stopped by SIGTERM; ")
    assert f"recorded in {out}; run the same command again to resume" in said[0]
    # the same command resumes (its entry point, in this process: the SIGKILL test's last resume
    # is the one that starts a new interpreter)
    assert cli_main("mquake-uns", _args(tiny, out, "single")) == 0
    assert _outcome(out) == reference["single"]


KILL_INSIDE = """import os, runpy, signal, sys
import torch
real = torch.save
def save(obj, f, *args, **kwargs):  # the snapshot's temporary file is opened, then the kill
    open(f, "wb").close()
    os.kill(os.getpid(), signal.SIGKILL)
torch.save = save
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@needs_data
def test_a_kill_inside_a_snapshot_write_leaves_no_temporary_file(tiny, tmp_path, reference):
    """SIGKILL between opening ``state.pt.<pid>.<tid>.tmp`` and renaming it used to leave the 0-byte
    file for good; the next start removes it, and the run ends as an uninterrupted one."""
    out = tmp_path / "run"
    killed = subprocess.run(
        [sys.executable, "-c", KILL_INSIDE, *_cmd(tiny, out, "sequential")[1:]],
        env=_env(tmp_path),
        capture_output=True,
        timeout=600,
    )
    assert killed.returncode == -signal.SIGKILL
    left = list((out / "sequence-state").glob("*.tmp"))
    assert len(left) == 1 and left[0].stat().st_size == 0
    assert cli_main("mquake-uns", _args(tiny, out, "sequential")) == 0  # the same command
    assert not list(out.rglob("*.tmp"))
    assert _outcome(out) == reference["sequential"]


@needs_data
def test_a_damaged_results_line_is_one_line_naming_the_file_and_line(
    tiny, tmp_path, caplog, capsys, monkeypatch
):
    """A middle line changed after it was written (an editor, a bad copy) used to raise a
    ValueError traceback in the runner."""
    out = tmp_path / "run"
    run_benchmark(_opts(tiny, out, "single"))
    lines = (out / "results.jsonl").read_text().splitlines(keepends=True)
    lines[1] = lines[1][: len(lines[1]) // 2] + "\n"
    (out / "results.jsonl").write_text("".join(lines))
    loaded = []
    monkeypatch.setattr(Editing, "ensure_model", lambda self: loaded.append(1))
    caplog.clear()
    capsys.readouterr()
    assert cli_main("mquake-uns", _args(tiny, out, "single")) == 2
    said = _one_line(caplog, capsys, "error")
    assert f"{out / 'results.jsonl'}: line 2 is not a JSON record" in said
    assert "delete it and run the same command again to redo its case" in said and not loaded


# ---------------------------------------------------------------------------------- python -m edit
PASSAGE = "Selma Varrick is a marine biologist born in Norway."


def _edit_args(tiny, tmp_path, save=None, subject="Selma Varrick", *extra):
    passage = tmp_path / "passage.txt"
    passage.write_text(PASSAGE)
    args = [
        "edit",
        "--hparams",
        str(tiny / "hpse.yaml"),
        "--subject",
        subject,
        "--passage-file",
        str(passage),
        "--ask",
        "Where was Selma Varrick born?",
        "--max-answer-tokens",
        "2",
        *extra,
    ]
    return args + (["--save", str(save)] if save else [])


def _edit_cmd(*args):
    return [sys.executable, "-m", "hpse_easyedit", *args]


def _saved_whole(save):
    names = sorted(p.name for p in save.iterdir())
    return names == ["adapter", "edit.json", "hparams.yaml"] and not list(
        save.parent.glob(f".{save.name}.partial-*")
    )


@pytest.mark.parametrize("reader", ["reads one line", "never reads"])
def test_a_closed_stdout_loses_no_edit(tiny, tmp_path, reader):
    """``edit --save DIR | head -1``: printing the answers after the edit used to raise
    BrokenPipeError before DIR was written. The edit is saved first, and a reader that went away
    stops nothing: exit code 0, no traceback."""
    save = tmp_path / "saved"
    env = {**_env(tmp_path), **({} if reader == "never reads" else {"PYTHONUNBUFFERED": "1"})}
    if reader == "never reads":
        env.pop("PYTHONUNBUFFERED")
    proc = subprocess.Popen(
        _edit_cmd(*_edit_args(tiny, tmp_path, save)),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    if reader == "reads one line":
        proc.stdout.readline()
    proc.stdout.close()  # like `| head -1` once it has its line
    stderr = proc.communicate(timeout=600)[1].decode()
    assert proc.returncode == 0 and "Traceback" not in stderr and "Exception" not in stderr, stderr
    assert _saved_whole(save)


def test_a_save_killed_half_way_leaves_the_directory_as_it_was(tiny, tmp_path):
    """SIGKILL while ``--save`` writes used to leave DIR with adapter/README.md only, and the same
    command then refused DIR as not empty. The edit goes to a temporary sibling renamed to DIR when
    complete: after the kill DIR is empty, and the same command saves there (and removes the dead
    writer's partial copy)."""
    save = tmp_path / "saved"
    args = _edit_args(tiny, tmp_path, save)
    kill = (
        "import os, signal, sys\nfrom hpse_easyedit import HPSEHyperParams\n"
        "from hpse_easyedit.cli import main\n"
        "HPSEHyperParams.to_yaml = lambda self, path: os.kill(os.getpid(), signal.SIGKILL)\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    killed = subprocess.run(
        [sys.executable, "-c", kill, *args], env=_env(tmp_path), capture_output=True, timeout=600
    )
    assert killed.returncode == -signal.SIGKILL
    assert save.is_dir() and not list(save.iterdir())
    assert len(list(tmp_path.glob(".saved.partial-*"))) == 1  # what the killed save had written
    assert edit_cli.main(args) == 0  # the same command (its entry point, in this process)
    assert _saved_whole(save)


def test_sighup_during_an_edit_is_one_line_and_saves_nothing(tiny, tmp_path):
    save = tmp_path / "saved"
    proc = subprocess.Popen(
        _edit_cmd(*_edit_args(tiny, tmp_path, save, "Selma Varrick", "--set", "rounds=200")),
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    for line in proc.stdout:  # PYTHONUNBUFFERED: the answers before the edit, then the edit
        if line.startswith(b"A: "):
            break
    time.sleep(1.0)
    proc.send_signal(signal.SIGHUP)
    stderr = proc.communicate(timeout=120)[1].decode()
    said = [x for x in stderr.splitlines() if x.startswith(("interrupted", "error", "Traceback"))]
    assert proc.returncode == 128 + signal.SIGHUP and len(said) == 1, stderr
    assert said[0] == (
        f"interrupted: stopped by SIGHUP; stopped during the edit; nothing was saved to --save "
        f"{save}; run the same command again to edit"
    )
    assert not list(save.iterdir())


def test_text_the_terminal_cannot_encode_is_escaped_not_fatal(tiny, tmp_path, monkeypatch):
    """An emoji subject under ``PYTHONIOENCODING=ascii`` used to end the edit with
    UnicodeEncodeError when printing it."""
    import io

    out = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr(sys, "stdout", out)
    code = edit_cli.main(_edit_args(tiny, tmp_path, None, "Selma \U0001f41f Varrick"))
    out.flush()
    text = out.buffer.getvalue().decode("ascii")
    assert code == 0 and "Introduce Selma \\U0001f41f Varrick." in text


@pytest.mark.parametrize(
    "bad, fragment",
    [
        ("/dev/zero", "is not a regular file (a FIFO, device or socket)"),
        ("subject", "shorten the subject"),
    ],
)
def test_a_passage_that_is_no_file_or_a_subject_that_is_too_long_is_one_line(
    tiny, tmp_path, capsys, bad, fragment
):
    """/dev/zero as a passage was called "a directory"; a 10,000-character subject blamed the
    passage (and printed the whole subject). Both fail before the first answer is generated."""
    args = _edit_args(tiny, tmp_path, None, "Selma " * 2000 if bad == "subject" else "Selma")
    if bad == "/dev/zero":
        args[args.index("--passage-file") + 1] = "/dev/zero"
    capsys.readouterr()
    assert edit_cli.main(args) == 2
    captured = capsys.readouterr()
    err = [x for x in captured.err.splitlines() if x.startswith("error")]
    assert len(err) == 1 and fragment in err[0] and len(err[0]) < 600, err
    assert "== before the edit" not in captured.out


# ------------------------------------------------------------------------------- the Python front
def test_two_threads_editing_one_model_the_second_is_refused_in_one_line(tmp_path):
    """FT-M edited from two threads at once died with an autograd error; the second edit of a model
    that is being edited is refused at once, and the first finishes as if alone."""
    import threading

    from hpse_easyedit import editor, hpse_edit
    from hpse_easyedit.locks import ModelBusyError
    from tiny_models import tiny_hparams

    model, tok = make_tiny_model_and_tokenizer("llama")
    hp = tiny_hparams(executor="ft_m", rounds=1, inner_steps=2, max_new_tokens=4)
    request = [{"subject": "Selma Varrick", "target_new": PASSAGE}]
    real, second = editor.make_executor, []

    def make_executor(*args, **kwargs):  # the first edit is under way: a second thread starts one
        if not second:
            second.append(None)

            def other():
                try:
                    hpse_edit(model, tok, request, hp)
                except ModelBusyError as err:
                    second[0] = err

            thread = threading.Thread(target=other)
            thread.start()
            thread.join()
        return real(*args, **kwargs)

    editor.make_executor = make_executor
    try:
        result = hpse_edit(model, tok, request, hp)
    finally:
        editor.make_executor = real
    assert isinstance(second[0], ModelBusyError) and "being edited already" in str(second[0])
    assert result.rounds and hpse_edit(model, tok, request, hp).rounds  # released afterwards
    code = edit_cli.run_cli(lambda args: (_ for _ in ()).throw(second[0]), [])
    assert code == 2  # one line, as every user error


def test_a_downloaded_edit_folder_never_turns_remote_code_on(tmp_path, monkeypatch):
    """``load_edit(DIR)`` followed DIR/hparams.yaml's ``trust_remote_code: true`` into a model
    folder whose config has an ``auto_map``: its code ran. Now only the caller's argument turns it
    on, and the refusal names the file that asked."""
    import json

    from hpse_easyedit import HParamsError, load_edit
    from hpse_easyedit.executors import EXECUTORS

    model_dir = tmp_path / "model"
    make_tiny_model_and_tokenizer("llama", tmp_path=model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "evil.Evil", "AutoConfig": "evil.EvilConfig"}
    (model_dir / "config.json").write_text(json.dumps(config))
    marker = tmp_path / "code-ran"
    (model_dir / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    edit = tmp_path / "downloaded-edit"
    (edit / "adapter" / "hpse").mkdir(parents=True)
    (edit / "hparams.yaml").write_text(
        f"alg_name: HPSE\nmodel_name: {model_dir}\ntrust_remote_code: true\n"
    )
    (edit / "edit.json").write_text(json.dumps({"executor": "lora", "weights": "adapter/hpse"}))
    with pytest.raises(HParamsError) as info:
        load_edit(edit)
    assert str(edit / "hparams.yaml") in str(info.value)
    assert "load_edit(..., trust_remote_code=True)" in str(info.value) and not marker.exists()
    seen = []  # with the caller's word, the flag reaches load_model
    monkeypatch.setattr(
        "hpse_easyedit.model_io.load_model", lambda hp: seen.append(hp) or (None, None)
    )
    monkeypatch.setattr(EXECUTORS["lora"], "load_edit", staticmethod(lambda model, weights: model))
    load_edit(edit, trust_remote_code=True)
    assert seen[0].trust_remote_code is True
    (edit / "edit.json").write_text(json.dumps({"executor": "lora", "weights": "../../etc"}))
    with pytest.raises(HParamsError, match="not a file or directory inside"):
        load_edit(edit, trust_remote_code=True)
