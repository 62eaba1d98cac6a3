"""One writer per directory: an OS lock on the directory itself, which dies with its process.

A benchmark run directory (``--out``) and an edit's ``--save`` directory are written by one process
at a time. The writer holds ``flock(LOCK_EX)`` on the directory's own file descriptor for as long as
it writes: a second writer is refused at once, with one line naming the directory and the process
that holds it, and a killed writer leaves no stale lock (the kernel drops it with the process). No
lock file is created, so a locked directory's contents are exactly what the writer put there.
Readers (the report, ``paired``, ``study``) take no lock: every file they read is appended line by
line or replaced whole (``hpse_easyedit.atomic``).

A writer that was killed leaves its temporary files behind (a half-converted model, a half-written
checkpoint or saved edit). Their names carry the writer's host and process id (``owned_prefix``,
``atomic.writer_tmp``), so the next start removes exactly those whose writer is gone
(``stale_temporaries``) and never one that a live process is still writing.

One model takes one edit at a time: ``editing(model)`` refuses a second edit of the same model
started while the first runs (two threads editing one model's shared weights corrupt each other's
autograd graphs and optimiser state).
"""

from __future__ import annotations

import fcntl
import glob
import os
import re
import socket
import threading
import time
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

__all__ = [
    "DirectoryBusyError",
    "ModelBusyError",
    "editing",
    "lock_holder",
    "owned_prefix",
    "process_gone",
    "stale_temporaries",
    "stale_writer_tmps",
    "writer_lock",
]


class DirectoryBusyError(RuntimeError):
    """Another process is writing into the directory; the message names it and the fix."""


class ModelBusyError(RuntimeError):
    """The model is being edited by another thread; the message says what to do instead."""


def lock_holder(path: str | os.PathLike) -> int | None:
    """The pid holding a ``flock`` on ``path`` according to ``/proc/locks`` (None where it cannot be
    told)."""
    try:
        inode = os.stat(path).st_ino
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if "->" in fields:  # a process waiting for the lock, not holding it
            continue
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5].rsplit(":", 1)[-1] == str(inode):
            return int(fields[4])
    return None


@contextmanager
def writer_lock(directory: str | os.PathLike, option: str = "--out") -> Iterator[Path]:
    """Create ``directory`` if needed and hold the exclusive writer lock on it for the block.

    Raises ``DirectoryBusyError`` at once when another process holds it.
    """
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = lock_holder(path)
            who = f"process {pid}" if pid is not None else "another process"
            raise DirectoryBusyError(
                f"{option} {path}: {who} is writing into this directory; wait for it to finish "
                f"(the same command then resumes) or give another {option}"
            ) from None
        yield path
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def process_gone(pid: int, host: str | None = None) -> bool:
    """True when process ``pid`` of ``host`` (default: this machine) is certainly not running, so
    what it left half-written may go; a process of another host is never judged gone."""
    if host is not None and host != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists but belongs to someone else
        return False
    return False


def owned_prefix(prefix: str) -> str:
    """``prefix`` followed by this process's host and pid: the start of a temporary name (for
    ``tempfile.mkdtemp``) whose owner ``stale_temporaries`` can tell."""
    return f"{prefix}{socket.gethostname()}-{os.getpid()}-"


def stale_temporaries(
    directory: str | os.PathLike, prefix: str, unowned_after: float | None = None
) -> list[Path]:
    """The entries of ``directory`` named ``owned_prefix(prefix)...`` whose process is gone; with
    ``unowned_after``, also those named ``prefix...`` without an owner (written before names had
    one) that are older than that many seconds."""
    found = []
    for path in Path(directory).glob(glob.escape(prefix) + "*"):
        parts = path.name[len(prefix) :].rsplit("-", 2)
        if len(parts) == 3 and parts[1].isdigit():
            if process_gone(int(parts[1]), parts[0]):
                found.append(path)
            continue
        try:
            age = time.time() - path.lstat().st_mtime
        except OSError:
            continue
        if unowned_after is not None and age > unowned_after:
            found.append(path)
    return found


#: ``atomic.writer_tmp``'s names: ``<target>.<pid>.<thread id><suffix>``
_WRITER_TMP = re.compile(r"^(?P<target>.+)\.(?P<pid>\d+)\.\d+\.tmp(?:\.\w+)?$")


def stale_writer_tmps(directory: str | os.PathLike) -> list[Path]:
    """The temporary files ``atomic.replacing`` left in ``directory`` when its process was killed
    between writing and renaming (a 0-byte ``state.pt.<pid>.<tid>.tmp``, say): those whose process
    is gone."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return [
        p
        for p in directory.iterdir()
        if (m := _WRITER_TMP.match(p.name)) and process_gone(int(m.group("pid")))
    ]


_EDITING: "weakref.WeakSet[Any]" = weakref.WeakSet()
_EDITING_LOCK = threading.Lock()


@contextmanager
def editing(model: Any) -> Iterator[None]:
    """Hold ``model`` (its base model, for a LoRA ``PeftModel``) as being edited for the block;
    ``ModelBusyError`` at once when another edit of it is running (in another thread)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    with _EDITING_LOCK:
        if base in _EDITING:
            raise ModelBusyError(
                f"this {type(base).__name__} is being edited already (another thread started an "
                "edit of the same model object); one model takes one edit at a time: wait for "
                "that edit to return, or edit a copy (copy.deepcopy(model)) in the other thread"
            )
        _EDITING.add(base)
    try:
        yield
    finally:
        with _EDITING_LOCK:
            _EDITING.discard(base)
