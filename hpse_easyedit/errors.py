"""The errors a user's input raises, and the checks of command-line options that raise them.

Every entry point (``python -m hpse_easyedit``, the benchmark runner and its reports) reports these
as one line on stderr with exit code 2 (``cli.run_cli``); they live here so that a module that
checks its options needs nothing of the command line itself.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Sequence

from .atomic import writer_tmp

__all__ = [
    "ENVIRONMENT_ERRNOS",
    "Interrupted",
    "UsageError",
    "check_new_dir",
    "check_positive",
    "check_text_file",
    "check_writable",
    "choice_text",
    "file_problem",
]


class UsageError(ValueError):
    """A command-line option is out of range or names a file that cannot be used; the message says
    which and the fix."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, carrying one line: what was finished and how to go on (``run_cli`` prints it, exit
    code 130)."""


#: OSErrors that are the machine's state, not a bug: a full disk, a quota, a read-only file system,
#: no permission
ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


def check_writable(option: str, directory: str | os.PathLike) -> None:
    """``UsageError`` unless ``directory`` can be created and written (a probe file, removed
    again)."""
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = writer_tmp(path / ".hpse-probe")
        probe.write_bytes(b"\0" * 65536)
        probe.unlink()
    except OSError as err:
        raise UsageError(
            f"{option} {path}: cannot write there ({err.strerror or err}); give a writable "
            "directory with free space"
        ) from None


def choice_text(choices: Sequence[str]) -> str:
    """``["auto", "llm", "lexical"]`` -> ``"auto, llm or lexical"``: the one wording of every choice
    message."""
    choices = list(choices)
    return choices[0] if len(choices) == 1 else ", ".join(choices[:-1]) + f" or {choices[-1]}"


def check_positive(
    option: str, value: int | float | None, minimum: int | float = 1, what: str = ""
) -> None:
    """``UsageError`` unless ``value`` is None or >= ``minimum``."""
    if value is not None and value < minimum:
        raise UsageError(
            f"{option} must be >= {minimum}{' (' + what + ')' if what else ''}, got {value}"
        )


def file_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be read as a file (``"no such file"``, ``"is a directory, not a
    file"``, ``"is not a regular file (a FIFO, device or socket)"``, ``"cannot be read (Too many
    levels of symbolic links)"``), or None. Reading a FIFO would wait for a writer forever, and
    ``/dev/zero`` never ends: neither is opened."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "no such file"
    except OSError as err:
        return f"cannot be read ({err.strerror or err})"
    if stat.S_ISDIR(mode):
        return "is a directory, not a file"
    if not stat.S_ISREG(mode):
        return "is not a regular file (a FIFO, device or socket)"
    return None


def check_text_file(option: str, path: str | os.PathLike) -> Path:
    """``UsageError`` unless ``path`` is a readable regular file."""
    p = Path(path)
    problem = file_problem(p)
    if problem == "no such file":
        raise UsageError(f"{option} {p}: no such file; give the path of an existing file")
    if problem is not None:
        raise UsageError(f"{option} {p}: {problem}; give the path of a text file")
    return p


def check_new_dir(
    option: str, path: str | os.PathLike | None, *, may_hold_files: bool = False
) -> None:
    """``UsageError`` when ``path`` names an existing file (or, unless ``may_hold_files``, a
    non-empty directory)."""
    if path is None:
        return
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{option} {p}: is a file, not a directory; give a directory path")
    if not may_hold_files and p.is_dir() and any(p.iterdir()):
        raise UsageError(
            f"{option} {p}: the directory exists and is not empty; choose a new directory"
        )
    parent = next((q for q in p.parents if q.exists()), None)
    if parent is not None and not parent.is_dir():
        raise UsageError(
            f"{option} {p}: {parent} is a file, so the directory cannot be created there"
        )
