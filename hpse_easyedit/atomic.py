"""Replace a file atomically, with a temporary name that is this writer's own.

Every file the project writes for later reading (statistics caches, results, summaries, reports) is
written under a temporary name beside its target and renamed over it, so a reader never sees half a
file. The temporary name carries the process and thread: two writers of the same target at once (one
run per core sharing a cache, say) each rename their own complete file, and neither renames the
other's half-written one away.
"""

from __future__ import annotations

import os
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator


def writer_tmp(path: str | os.PathLike, suffix: str = ".tmp") -> Path:
    """A temporary name beside ``path`` that no other process or thread uses at the same time."""
    path = Path(path)
    return path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}{suffix}")


@contextmanager
def replacing(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield this writer's temporary path beside ``path``; rename it over ``path`` when the block
    ends.

    ``suffix`` ends the temporary name (``.tmp.npz`` for ``np.savez``, which appends ``.npz`` to any
    other name). If the block raises, the temporary file is removed and ``path`` is left as it was.
    """
    tmp = writer_tmp(path, suffix)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_aside(
    write: Callable[[Path], None], prefix: str, *, suffix: str = "", directory: bool = False
) -> Path | None:
    """Where a write failed on the machine's state (a full disk), write the same thing whole under a
    new temporary name instead: in the system's temporary directory, else in ``/dev/shm``.
    ``write(path)`` fills ``path`` (a new empty file, or with ``directory`` a new empty directory).
    Returns that path, or None when neither could hold it."""
    for root in (tempfile.gettempdir(), "/dev/shm"):
        try:
            if directory:
                path = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
            else:
                fd, name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=root)
                os.close(fd)
                path = Path(name)
            write(path)
        except OSError:
            continue
        return path
    return None
