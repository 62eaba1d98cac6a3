"""The output directory of one benchmark run: what it records and how a rerun resumes from it.

``config.json`` (a rerun must match it, ``store.config_policy`` says what may change), one results
file per process, in continual mode the block in progress (``benchmarks.records.sequence``),
``environments.jsonl`` (what produced the cases of each invocation), the writer lock, and records
kept in memory on a full disk.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from hpse_easyedit.atomic import write_aside
from hpse_easyedit.errors import ENVIRONMENT_ERRNOS, Interrupted, UsageError, check_writable
from hpse_easyedit.locks import writer_lock

from ..records.sequence import SequenceLog
from ..records.store import (
    CONFIG,
    ConfigPolicy,
    ResultFile,
    check_run_config,
    merge_results,
    read_results,
    result_files,
    results_name,
)
from .distributed import ProcessContext

__all__ = ["ENVIRONMENTS_FILE", "RunDirectory", "environment_record", "units", "write_kept"]

log = logging.getLogger(__name__)

ENVIRONMENTS_FILE = "environments.jsonl"
_RECORDED_PACKAGES = ("torch", "transformers", "peft", "accelerate", "tokenizers")


def units(n: int, sequential: int | None) -> list[list[int]]:
    """What one process runs at a time: single cases, or in continual mode whole blocks of T
    cases."""
    if sequential:
        return [list(range(s, min(s + sequential, n))) for s in range(0, n, sequential)]
    return [[i] for i in range(n)]


class RunDirectory:
    """One run's ``--out`` as this process sees it: its results file, its sequence log, the others'
    files."""

    def __init__(self, path: Path, ctx: ProcessContext, policy: ConfigPolicy) -> None:
        self.path = path
        self.ctx = ctx
        self.policy = policy
        self.results: ResultFile | None = None
        self.sequence: SequenceLog | None = None

    @contextmanager
    def writing(self) -> Iterator[None]:
        """The main process holds the directory's writer lock throughout, so a second run into the
        same ``--out`` stops at once instead of editing every case again; Ctrl-C becomes the one
        line that says how to go on."""
        if not self.ctx.is_main:
            yield
            return
        check_writable("--out", self.path)
        with writer_lock(self.path, "--out"):
            try:
                yield
            except KeyboardInterrupt:
                done = (
                    len(merge_results(self.path, None, require_all=False))
                    if self.path.is_dir()
                    else 0
                )
                raise Interrupted(
                    f"{done} case(s) are recorded in {self.path}; run the same command again to "
                    "resume from there (a continual sequence resumes after its last edit)"
                ) from None

    def open(
        self,
        config: Mapping[str, Any],
        ids: list[str],
        blocks: list[list[int]],
        *,
        sequential: bool,
        retry_failed: bool,
    ) -> set[str]:
        """Check config.json, open this process's results file; returns the case ids already done.

        The main process runs this before the others (``main_first``): it records config.json, cuts
        torn last lines off every results file and, in continual mode, drops the records of
        unfinished blocks, so no file changes under the others' feet but their own.
        """
        main, rank, world = self.ctx.is_main, self.ctx.rank, self.ctx.world
        if main:
            self._forget_config_of_a_run_that_never_started()
        check_run_config(self.path, config, write=main, policy=self.policy)
        own = self.path / results_name(rank, world)
        retry_blocks: set[int] = set()
        if main:
            files = {p: ResultFile(p) for p in result_files(self.path)}
            merge_results(self.path, ids, require_all=False)  # refuses a case recorded twice
            if retry_failed:
                retry_blocks = self._drop_failed(files, ids, blocks, sequential)
            if sequential:
                self._drop_unfinished_blocks(files, ids, blocks)
        self.results = ResultFile(own)
        if sequential:
            self.sequence = SequenceLog(self.path, rank, world)
            finished = {
                b
                for b, blk in enumerate(blocks)
                if all(ids[i] in self.results.records for i in blk)
            }
            self.sequence.forget(
                lambda r: r.get("block") not in finished
            )  # moved to results, killed before dropping
            self.sequence.checkpoints.drop(lambda r: r.get("block") not in retry_blocks)
        # Files of this launch's other processes hold only their cases, and are being written to.
        peers = {results_name(r, world) for r in range(world)} - {own.name}
        done = set(self.results.records)
        for path in result_files(self.path):
            if path.name not in peers and path != own:
                done |= set(read_results(path))
        return done

    @staticmethod
    def _drop_unfinished_blocks(
        files: Mapping[Path, ResultFile], ids: list[str], blocks: list[list[int]]
    ) -> None:
        done = {cid for f in files.values() for cid in f.records}
        selected = set(ids)
        whole = {ids[i] for blk in blocks if all(ids[j] in done for j in blk) for i in blk}
        dropped = [
            cid
            for f in files.values()
            for cid in f.drop(
                lambda r: str(r["case_id"]) in whole or str(r["case_id"]) not in selected
            )
        ]
        if dropped:
            log.warning(
                "dropping %d record(s) of an unfinished block; the block is redone", len(dropped)
            )

    @staticmethod
    def _drop_failed(
        files: Mapping[Path, ResultFile], ids: list[str], blocks: list[list[int]], sequential: bool
    ) -> set[int]:
        """``--retry-failed``: forget the records of failed edits (in continual mode, of their whole
        blocks) so they are edited again; returns the blocks to redo."""
        failed = {cid for f in files.values() for cid, r in f.records.items() if "failed" in r}
        redo = {b for b, unit in enumerate(blocks) if any(ids[i] in failed for i in unit)}
        if sequential:
            failed = {ids[i] for b in redo for i in blocks[b]}
        for f in files.values():
            f.drop(lambda r: str(r["case_id"]) not in failed)
        if failed:
            log.info("--retry-failed: %d case(s) are edited again", len(failed))
        return redo if sequential else set()

    def _forget_config_of_a_run_that_never_started(self) -> None:
        """A config.json with no result and no MMLU baseline beside it was written by a run that
        stopped before its first edit (a model that could not be loaded, a layer the model lacks):
        fixing the hparams and rerunning into the same --out must not be refused as another
        configuration, so that config.json is dropped."""
        path = self.path / CONFIG
        if not path.is_file() or (self.path / "mmlu_before.json").exists():
            return
        if any(read_results(p) or p.stat().st_size for p in result_files(self.path)):
            return
        log.info(
            "%s: no case was recorded under it (the last run stopped before its first edit); "
            "recording the current configuration instead",
            path,
        )
        path.unlink()

    def record_environment(self, case_ids: Sequence[str], **at_once: int) -> None:
        """One line in ``environments.jsonl`` for the cases this invocation edits (and, when it
        edits several cases or sequences at once, how many: ``cases_at_once=B``,
        ``sequences_at_once=S``)."""
        record = environment_record(case_ids, self.ctx)
        record.update((k, v) for k, v in at_once.items() if v > 1)
        with open(self.path / ENVIRONMENTS_FILE, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")

    def recorded_hparams(self, current: dict) -> dict:
        """The hparams as config.json recorded them when the run started: a resume or a re-summary
        on another device (``--set device=...``, which config.json ignores) never rewrites where the
        run was recorded to run."""
        path = self.path / CONFIG
        if path.is_file():
            return json.loads(path.read_text(encoding="utf-8")).get("hparams", current)
        return current


#: the checkout this package runs from (an installed copy has no ``.git`` here: no commit recorded)
_SOURCE = Path(__file__).resolve().parents[2]


def _git_commit(path: str | os.PathLike) -> str | None:
    """The commit checked out at ``path``, with ``-dirty`` after it where tracked files differ from
    it (None where it is not a git checkout or git is absent)."""
    import subprocess

    try:
        out = subprocess.run(
            [
                "git",
                "-C",
                str(path),
                "describe",
                "--always",
                "--dirty",
                "--abbrev=40",
                "--exclude=*",
            ],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out or None


def environment_record(case_ids: Sequence[str], ctx: ProcessContext) -> dict:
    """What produced the cases one invocation edits: package versions, this project's commit and the
    EasyEdit checkout's, the machine, the instruction set torch's CPU kernels dispatch to and its
    intra-op thread count (another instruction set or thread count can change sums in their last
    digits, so a resume on another host or under another ``OMP_NUM_THREADS`` is visible here, and a
    replay that computes other values than its record can be traced to it).

    A run that resumes in another environment (a newer transformers, another EasyEdit commit) keeps
    one such line per invocation in ``environments.jsonl``, so every record can be traced to the
    versions that made it; none of this is part of ``config.json``, which a resume must match.
    """
    import platform
    from datetime import datetime, timezone
    from importlib import metadata

    import torch

    versions = {}
    for name in _RECORDED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    src = os.environ.get("EASYEDIT_SRC")
    easyedit = {"src": src, "commit": _git_commit(src)} if src else None
    return {
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "rank": ctx.rank,
        "world": ctx.world,
        "cases": list(case_ids),
        "python": platform.python_version(),
        **versions,
        "commit": _git_commit(_SOURCE) if (_SOURCE / ".git").exists() else None,
        "easyedit": easyedit,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
    }


def write_kept(file: ResultFile, records: list[dict]) -> None:
    """Append finished records; on a full disk they are kept in memory and written as soon as space
    is freed (tried every 10 s for ``$HPSE_DISK_FULL_WAIT`` seconds, default 600), then saved whole
    to a temporary file the one-line error names, so no finished case is lost."""
    wait, waited = float(os.environ.get("HPSE_DISK_FULL_WAIT", 600)), 0.0
    while True:
        try:
            file.append(records)
            return
        except OSError as err:
            if err.errno not in ENVIRONMENT_ERRNOS:
                raise
            if waited >= wait or err.errno not in (
                errno.ENOSPC,
                errno.EDQUOT,
            ):  # no space to wait for
                payload = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
                kept = write_aside(
                    lambda path, payload=payload: path.write_text(payload, encoding="utf-8"),
                    f"hpse-unwritten-{file.path.name}-",
                    suffix=".jsonl",
                )
                where = (
                    f"saved whole to {kept}: append it with `cat {kept} >> {file.path}`"
                    if kept
                    else "lost"
                )
                raise UsageError(
                    f"{file.path}: {err.strerror or err}; the {len(records)} finished record(s) "
                    f"were {where} once space is freed, then run the same command again to go on"
                ) from None
            if not waited:
                log.warning(
                    "%s: %s; the %d finished record(s) are kept in memory and written as soon as "
                    "space is freed (trying every 10 s for %.0f s)",
                    file.path,
                    err.strerror,
                    len(records),
                    wait,
                )
            step = min(10.0, wait - waited)
            time.sleep(step)
            waited += step
