"""Where the benchmarks read their data and keep what they generate: defined once, here.

The data directory is read-only input: ``--data``, else ``$HPSE_DATA_DIR``, else ``../shared/data``
next to the repository (``hpse_easyedit.data_files.data_dir``, the rule the core package's built-in
corpora use too; the files' names inside it are ``hpse_easyedit.data_files``'s). Everything
generated (judge answers, LLM subjects and passages) goes to the cache directory, never into the
data directory: ``--cache-dir``, else ``$HPSE_CACHE_DIR``, else ``$XDG_CACHE_HOME/hpse_easyedit``
(``~/.cache/hpse_easyedit`` when ``XDG_CACHE_HOME`` is unset), the directory that also holds
converted models.
"""

from __future__ import annotations

from pathlib import Path

from hpse_easyedit.data_files import data_dir as _data_dir
from hpse_easyedit.loading import cache_dir as _cache_dir

__all__ = ["JUDGE_CACHE", "default_cache_dir", "default_data_dir"]

#: the SQLite file, inside the cache directory, that holds every well-formed LLM answer
JUDGE_CACHE = "judge_cache.sqlite"


def default_data_dir() -> Path:
    """``$HPSE_DATA_DIR`` if set, else ``../shared/data`` relative to the repository root."""
    return _data_dir()


def default_cache_dir() -> Path:
    """``$HPSE_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/hpse_easyedit``: judge answers and
    generated data."""
    return _cache_dir()
