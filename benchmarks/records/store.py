"""A results directory that survives being killed and can be filled by several processes at once.

Each process appends its finished cases to its own results file, one JSON line per case, flushed and
fsync'ed as soon as the case is done, so a kill loses at most the case in flight:

- ``results.jsonl`` when one process runs (what every single-process run writes),
- ``results.rank{R}-of-{N}.jsonl`` for process R of an N-process launch (see
  ``benchmarks.run.distributed``).

A file has exactly one writer. On reopening it, a torn last line (killed mid-write) is cut off. The
cases recorded in ANY results file of the directory count as done, so a rerun with another number of
processes resumes too; ``merge_results`` reads them all back and insists that every expected case is
there exactly once before anything is summarised.

``config.json`` holds what the results depend on (method and hparams, benchmark, data files and
their hashes, judge, generation settings); reopening the directory with a different configuration is
refused, so results of two configurations never mix and nobody's results are overwritten. A
``ConfigPolicy`` says which differences are not a change of configuration: where the model ran
(``device``), and hparams fields that are new in the code and still at their default value.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from hpse_easyedit.atomic import replacing

__all__ = [
    "KERNEL_KEYS",
    "PLACEMENT_KEYS",
    "ConfigMismatchError",
    "case_key",
    "ConfigPolicy",
    "IncompleteRunError",
    "ResultFile",
    "ResultsFileError",
    "check_run_config",
    "config_policy",
    "json_plain",
    "merge_results",
    "read_results",
    "result_files",
    "results_name",
    "write_json_atomic",
    "write_new_json",
    "write_text_atomic",
]

log = logging.getLogger(__name__)

RESULTS = "results.jsonl"
CONFIG = "config.json"
_RESULTS_RE = re.compile(r"^results(?:\.rank(\d+)-of-(\d+))?\.jsonl$")

KeyPath = tuple[str, ...]


class ConfigMismatchError(RuntimeError):
    """The output directory holds results of a different configuration."""


class IncompleteRunError(RuntimeError):
    """The results files of a directory do not hold every expected case exactly once."""


class ResultsFileError(ValueError):
    """A line of a results file is damaged or repeats a case; the message names the file, the line
    and the fix."""


def results_name(rank: int = 0, world: int = 1, stem: str = "results") -> str:
    """The results file of process ``rank`` of ``world`` (``results.jsonl`` for a single process);
    ``stem`` names another per-process file of the same layout (``checkpoints``, ``sequence``)."""
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, {world}), got {rank}")
    return f"{stem}.jsonl" if world == 1 else f"{stem}.rank{rank}-of-{world}.jsonl"


def result_files(out_dir: str | os.PathLike, stem: str = "results") -> list[Path]:
    """Every results file of a run directory, single-process and per-process ones, in a stable order
    (``stem``: the files of another per-process name, e.g. ``checkpoints``)."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return []
    pattern = (
        _RESULTS_RE
        if stem == "results"
        else re.compile(rf"^{re.escape(stem)}(?:\.rank(\d+)-of-(\d+))?\.jsonl$")
    )
    found = []
    for p in out_dir.iterdir():
        m = pattern.match(p.name)
        if m and p.is_file():
            world, rank = (int(m.group(2)), int(m.group(1))) if m.group(1) else (1, 0)
            found.append(((world, rank), p))
    return [p for _, p in sorted(found)]


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON to a temporary file, then rename it over ``path`` (never a half-written file)."""
    with replacing(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=1, ensure_ascii=False, sort_keys=False)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write text to a temporary file, then rename it over ``path`` (never a half-written file)."""
    with replacing(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def write_new_json(path: str | os.PathLike, obj: Any) -> None:
    """``write_json_atomic`` into a file that must not exist yet (parents created): a report never
    replaces one."""
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"{path} exists; choose a new file (reports are never overwritten)")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, obj)


# -------------------------------------------------------------------------------------- config.json
_MISSING = "<missing>"


@dataclass(frozen=True)
class ConfigPolicy:
    """Which differences between a recorded ``config.json`` and the current configuration are no
    change.

    ``ignored(path)``: keys whose value may differ freely (where the run executes, not what it
    computes). ``new_default(path, value)``: a key absent from the recorded config whose current
    ``value`` is the default of a field that is new in the code; old results were computed without
    that field, i.e. with the behaviour its default keeps. Such keys are added to ``config.json``
    (by the writing process), so a later change of that default is caught as a real change.
    """

    ignored: Callable[[KeyPath], bool] = lambda path: False
    new_default: Callable[[KeyPath, Any], bool] = lambda path, value: False


def _diff(old: Any, new: Any, path: KeyPath = ()) -> list[tuple[KeyPath, Any, Any]]:
    """(path, old, new) for every leaf where two JSON values differ; a missing key reads as
    ``_MISSING``."""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            out += _diff(old.get(k, _MISSING), new.get(k, _MISSING), path + (str(k),))
        return out
    return [] if old == new else [(path, old, new)]


def _insert(config: dict, path: KeyPath, value: Any) -> None:
    node = config
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value


# ------------------------------------------------------------------------------------ config policy
#: hparams keys that say where a run executes, not what it computes: a rerun may change them freely
#: (move a half-done run to other GPUs, or under accelerate launch, where each process sets its own
#: device).
PLACEMENT_KEYS = ("device", "model_parallel")
#: hparams keys that choose kernels for the same computation (results differ only in float rounding,
#: as they do on another CPU's BLAS): a rerun may change them too; config.json keeps the value the
#: run started with.
KERNEL_KEYS = (
    "fast_decode",
    "scored_logits_only",
    "static_decode",
    "decode_stop_every",
    "attn_implementation",
    "gradient_checkpointing",
    "cases_per_pass",
)

#: config keys outside the hparams that choose how the same edits are computed: how many
#: independent cases (or continual sequences) are edited in one batched pass
#: (``hpse_easyedit.batched``; each case's result is its solo edit's up to float rounding). A
#: resume may change them; config.json keeps the value the run started with, and
#: environments.jsonl records each invocation's.
RUN_KERNEL_KEYS = (("cases_at_once",), ("sequences_at_once",))


def json_plain(value: Any) -> Any:
    """JSON-able copy of engine diagnostics (tensors and numpy scalars become Python numbers)."""
    if isinstance(value, Mapping):
        return {str(k): json_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _field_defaults(obj: Any) -> dict[str, Any]:
    """Default of every dataclass field reachable from an hparams object, by field name (JSON form).

    A name that two dataclasses define with different defaults is left out (no way to tell which
    one a recorded key meant). Objects that are not dataclasses contribute nothing.
    """
    out: dict[str, Any] = {}
    clash: set[str] = set()

    def walk(o: Any) -> None:
        if not dataclasses.is_dataclass(o) or isinstance(o, type):
            return
        for f in dataclasses.fields(o):
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                default = f.default_factory()  # type: ignore[misc]
            else:
                default = dataclasses.MISSING
            if default is dataclasses.MISSING or dataclasses.is_dataclass(default):
                walk(getattr(o, f.name, None))  # a required field, or a nested group of fields
                continue
            try:
                value = json.loads(json.dumps(json_plain(default)))
            except (
                TypeError,
                ValueError,
            ):  # not a JSON value, so never in a recorded config either
                continue
            if f.name in out and out[f.name] != value:
                clash.add(f.name)
            out[f.name] = value

    walk(obj)
    return {k: v for k, v in out.items() if k not in clash}


def config_policy(hparams: Any) -> ConfigPolicy:
    """What a rerun may differ in from a run directory's ``config.json`` without being another
    configuration.

    Placement and kernel keys of the hparams (``PLACEMENT_KEYS``, ``KERNEL_KEYS``) and the run's
    own kernel keys (``RUN_KERNEL_KEYS``: ``cases_at_once``, ``sequences_at_once``) are ignored; a
    key directly under ``hparams`` that the recorded config does not have is accepted when its value
    is the default of that field in the code (a field added to the hparams after the run started, at
    the behaviour the old code had). Anything else that differs, nested keys included, is a
    different configuration.
    """
    defaults = _field_defaults(hparams)
    return ConfigPolicy(
        ignored=lambda path: (
            (len(path) == 2 and path[0] == "hparams" and path[1] in PLACEMENT_KEYS + KERNEL_KEYS)
            or path in RUN_KERNEL_KEYS
        ),
        new_default=lambda path, value: (
            len(path) == 2
            and path[0] == "hparams"
            and path[1] in defaults
            and defaults[path[1]] == value
        ),
    )


def check_run_config(
    out_dir: str | os.PathLike,
    config: Mapping[str, Any],
    *,
    write: bool = True,
    policy: ConfigPolicy | None = None,
) -> None:
    """Make sure ``out_dir`` holds results of ``config`` only; record ``config.json`` when
    ``write``.

    A directory with results files but no ``config.json`` was not written by this runner and is
    refused. With ``write=False`` (every process but the main one) ``config.json`` must already be
    there: the main process records it before the others open the directory.
    """
    out_dir = Path(out_dir)
    policy = policy or ConfigPolicy()
    config = json.loads(json.dumps(config))  # plain JSON types, as they will read back
    config_path = out_dir / CONFIG
    if not config_path.is_file():
        foreign = [p for p in result_files(out_dir) if p.stat().st_size]
        if foreign:
            raise ConfigMismatchError(
                f"{foreign[0]} exists without {CONFIG}; it was not "
                "written by this runner. Use another --out directory."
            )
        if not write:
            raise ConfigMismatchError(
                f"{config_path} is missing although the main process writes it before the other "
                f"processes open {out_dir}; with several hosts, --out must be on a filesystem "
                "every host sees (NFS, Lustre, ...)"
            )
        out_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(config_path, config)
        return
    with open(config_path, encoding="utf-8") as fh:
        old = json.load(fh)
    changed, added = [], []
    for path, before, now in _diff(old, config):
        if policy.ignored(path):
            continue
        if before == _MISSING and policy.new_default(path, now):
            added.append((path, now))
        else:
            changed.append(f"{'.'.join(path)}: {before!r} -> {now!r}")
    if changed:
        raise ConfigMismatchError(
            f"{out_dir} already holds results of a different configuration ("
            + "; ".join(changed[:8])
            + ("; ..." if len(changed) > 8 else "")
            + "). Use another --out directory, or delete this one to start over."
        )
    if added and write:
        for path, value in added:
            _insert(old, path, value)
        write_json_atomic(config_path, old)
        log.info(
            "%s: recorded %s (new in this version of the code, "
            "at their defaults: the results there stay valid)",
            config_path,
            ", ".join(f"{'.'.join(p)}={v!r}" for p, v in added),
        )


# ------------------------------------------------------------------------------------ results files
def case_key(record: Mapping[str, Any]) -> str:
    """What identifies a record of a results file: its ``case_id``."""
    return str(record.get("case_id"))


def _parse(
    path: Path, data: bytes, key: Callable[[Mapping[str, Any]], str] = case_key
) -> tuple[dict[str, dict], bytes]:
    """Records of a results file's bytes (by ``key``), and the torn tail after its last newline (b''
    if none)."""
    *complete, torn = data.split(
        b"\n"
    )  # every record ends with a newline; text after the last one is torn
    records: dict[str, dict] = {}
    for n, raw in enumerate(complete, 1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except ValueError:
            rec = None
        if not isinstance(rec, dict):
            raise ResultsFileError(
                f"{path}: line {n} is not a JSON record (the file was changed after it was "
                "written: each line is written whole); repair that line, or delete it and run the "
                "same command again to redo its case"
            )
        cid = key(rec)
        if cid in records:
            raise ResultsFileError(
                f"{path}: case_id {cid} appears twice (line {n}); delete one of the two lines"
            )
        records[cid] = rec
    return records, torn


def read_results(
    path: str | os.PathLike, key: Callable[[Mapping[str, Any]], str] = case_key
) -> dict[str, dict]:
    """The records of a results file, read only: a last line without its newline (torn, or still
    being written by its process) is left out and left alone."""
    path = Path(path)
    if not path.is_file():
        return {}
    return _parse(path, path.read_bytes(), key)[0]


class ResultFile:
    """One append-only results file, keyed by ``case_id`` (or ``key``); only its own process writes
    to it."""

    def __init__(
        self, path: str | os.PathLike, key: Callable[[Mapping[str, Any]], str] = case_key
    ) -> None:
        self.path = Path(path)
        self.key = key
        self.records: dict[str, dict] = {}
        if self.path.is_file():
            data = self.path.read_bytes()
            self.records, torn = _parse(self.path, data, key)
            if torn:
                log.warning(
                    "%s: dropping a torn last line (the previous run was killed while writing it)",
                    self.path,
                )
                with open(self.path, "r+b") as fh:
                    fh.truncate(len(data) - len(torn))

    def __contains__(self, case_id: object) -> bool:
        return str(case_id) in self.records

    def __len__(self) -> int:
        return len(self.records)

    def append(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Append records (one line each) in a single write, then flush and fsync; if the write
        fails the file is cut back to what it held, so the same records can be appended again."""
        records = [dict(r) for r in records]
        for r in records:
            cid = self.key(r)
            if cid in self.records:
                raise ValueError(
                    f"case {cid} is already recorded in {self.path}; refusing to write it twice"
                )
        payload = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        size = self.path.stat().st_size if self.path.exists() else 0
        try:
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(payload)
                fh.flush()
                os.fsync(fh.fileno())
        except (
            OSError
        ):  # e.g. a full disk: no partial line is left behind, the caller may write them again
            with contextlib.suppress(OSError):
                os.truncate(self.path, size)
            raise
        for r in records:
            self.records[self.key(r)] = r

    def drop(self, keep: Callable[[dict], bool]) -> list[str]:
        """Rewrite the file keeping only records for which ``keep`` is true; returns the dropped
        case ids."""
        dropped = [cid for cid, r in self.records.items() if not keep(r)]
        if not dropped:
            return []
        self.records = {cid: r for cid, r in self.records.items() if keep(r)}
        self._rewrite()
        return dropped

    def replace(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Put new versions of already recorded cases in place (same order), rewriting the file
        atomically."""
        records = [dict(r) for r in records]
        for r in records:
            if self.key(r) not in self.records:
                raise ValueError(
                    f"case {r['case_id']} is not recorded in {self.path}; append it instead"
                )
        if not records:
            return
        for r in records:
            self.records[self.key(r)] = r
        self._rewrite()

    def _rewrite(self) -> None:
        with replacing(self.path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
            fh.write(
                "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in self.records.values())
            )
            fh.flush()
            os.fsync(fh.fileno())


def merge_results(
    out_dir: str | os.PathLike, case_ids: Sequence[str] | None, *, require_all: bool = True
) -> dict[str, dict]:
    """The records of ``case_ids`` (``None``: every recorded case) from every results file of
    ``out_dir``, each found exactly once.

    Raises ``IncompleteRunError`` when a case is recorded in two files (two runs wrote into the
    directory at once, or a file was copied in) or, with ``require_all``, when a case is missing.
    Records of other cases (beyond a lowered ``--limit``) are ignored.
    """
    out_dir = Path(out_dir)
    wanted = None if case_ids is None else {str(c) for c in case_ids}
    found: dict[str, dict] = {}
    where: dict[str, Path] = {}
    for path in result_files(out_dir):
        for cid, rec in read_results(path).items():
            if wanted is not None and cid not in wanted:
                continue
            if cid in found:
                raise IncompleteRunError(
                    f"case {cid} is recorded twice, in {where[cid].name} and {path.name} "
                    f"({out_dir}); two runs wrote into this directory at once, or a results file "
                    "was copied in. Remove the line from one of them."
                )
            found[cid], where[cid] = rec, path
    missing = [c for c in case_ids or () if str(c) not in found]
    if require_all and missing:
        files = ", ".join(p.name for p in result_files(out_dir)) or "none"
        raise IncompleteRunError(
            f"{out_dir}: {len(missing)} of {len(case_ids)} case(s) have no result (first: "
            f"{', '.join(missing[:5])}; results files: {files}); not summarising a partial run. "
            "Rerun the same command to finish them."
        )
    return found
