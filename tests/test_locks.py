"""One writer per directory: a second writer is refused at once naming the holder; a killed holder
leaves none."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpse_easyedit.locks import DirectoryBusyError, lock_holder, writer_lock

REPO = Path(__file__).resolve().parents[1]

# the holder loads locks.py alone (not the package, which imports torch)
HOLD = """import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("locks", "hpse_easyedit/locks.py")
locks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(locks)
with locks.writer_lock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(60)
"""


def _holder(directory):
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(directory)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_writer_is_refused_naming_the_process_that_holds_the_directory(tmp_path):
    proc = _holder(tmp_path / "run")
    try:
        assert lock_holder(tmp_path / "run") == proc.pid
        with pytest.raises(
            DirectoryBusyError,
            match=rf"--out .*run: process {proc.pid} is writing into this directory",
        ):
            with writer_lock(tmp_path / "run"):
                pass
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_writer_leaves_no_lock_and_no_file(tmp_path):
    proc = _holder(tmp_path / "run")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with writer_lock(tmp_path / "run", "--save") as path:
        assert (
            list(path.iterdir()) == []
        )  # the lock is on the directory itself: nothing is written into it
    with writer_lock(tmp_path / "run"):  # released when the block ends
        with pytest.raises(DirectoryBusyError, match="--save"):
            with writer_lock(tmp_path / "run", "--save"):
                pass


def test_the_lock_is_held_only_while_the_block_runs(tmp_path):
    with writer_lock(tmp_path / "a"):
        assert lock_holder(tmp_path / "a") == os.getpid()
    t0 = time.time()
    with writer_lock(tmp_path / "a"):
        pass
    assert time.time() - t0 < 5 and lock_holder(tmp_path / "a") is None
