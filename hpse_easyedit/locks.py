"""One writer per directory: an OS lock on the directory itself, which dies with its process.

A benchmark run directory (``--out``) and an edit's ``--save`` directory are written by one process
at a time. The writer holds ``flock(LOCK_EX)`` on the directory's own file descriptor for as long as
it writes: a second writer is refused at once, with one line naming the directory and the process
that holds it, and a killed writer leaves no stale lock (the kernel drops it with the process). No
lock file is created, so a locked directory's contents are exactly what the writer put there.
Readers (the report, ``paired``, ``study``) take no lock: every file they read is appended line by
line or replaced whole (``hpse_easyedit.atomic``).
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

__all__ = ["DirectoryBusyError", "lock_holder", "writer_lock"]


class DirectoryBusyError(RuntimeError):
    """Another process is writing into the directory; the message names it and the fix."""


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
