"""Continual editing that can stop in the middle of a sequence, and be evaluated part-way through.

A sequence of T edits (``--sequential T``) takes hours at T = 100 on a CPU, longer than a machine
may stay up. Two files of the run directory keep what a stopped sequence had done, and one folder
what it had edited:

- ``sequence.jsonl``: one line per finished edit of the block in progress (its record without
  scores: subjects, seconds, rounds, rollouts), appended and fsync'ed after each edit. When the
  block finishes its records move to ``results.jsonl`` with their scores and these lines are
  dropped.
- ``checkpoints.jsonl``: with ``--checkpoints 10,20,50``, the scores of the cases edited so far
  after the 10th, 20th and 50th edit of each block (one line per case and checkpoint, ``checkpoint``
  = edits made).
- ``sequence-state/``: the tensors the sequence has changed so far (and their values before its
  first edit), rewritten after each edit, and after each replayed one that matches its record
  (replaced whole; a write a kill cut short leaves a temporary file there that the next start
  removes). Weights: never commit this folder.
- ``sequence-answers.jsonl``: the answers of an evaluation in progress (after the block's last edit
  or at a checkpoint), one line per batch of questions as it finishes; an evaluation stopped
  part-way goes on from the first batch it lacks (each line carries a fingerprint of its questions
  and system prompt, so a line that does not match is redone). Its lines go when the evaluation's
  records are written.

A rerun into the same directory resumes the block after its last recorded edit: from the snapshot
when the method can load one (``MethodSpec.resume``: HPSE, its plain executors and COIN*), otherwise
by replaying the recorded edits from the unedited model. A replayed edit must reproduce its recorded
losses; when one does not (another machine, other kernels) the lines from it on and the checkpoints
after it are dropped and redone, so a block never mixes two trajectories. Under a multi-process
launch each process has its own files (``sequence.rankR-of-N.jsonl``, ...), as for ``results``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from hpse_easyedit.atomic import replacing
from hpse_easyedit.locks import stale_writer_tmps

from .store import ResultFile, read_results, result_files, results_name

__all__ = [
    "ANSWERS",
    "CHECKPOINTS",
    "PartialAnswers",
    "SEQUENCE",
    "STATE_DIR",
    "SequenceLog",
    "checkpoint_key",
    "checkpoint_records",
    "parse_checkpoints",
    "same_edit",
    "split_checkpoint",
]

log = logging.getLogger(__name__)

SEQUENCE = "sequence"
CHECKPOINTS = "checkpoints"
ANSWERS = "sequence-answers"
STATE_DIR = "sequence-state"


def checkpoint_key(record: Mapping[str, Any]) -> str:
    """A checkpoint record is one case at one checkpoint."""
    return f"{record['checkpoint']}:{record['case_id']}"


def parse_checkpoints(value: str) -> list[int]:
    """``"10,20,50"`` -> ``[10, 20, 50]`` (argparse type)."""
    try:
        return [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise ValueError(
            f"--checkpoints takes comma-separated edit counts, e.g. 10,20,50; got {value!r}"
        ) from None


def split_checkpoint(run: str | Path) -> tuple[Path, int | None]:
    """``"runs/uk-seq100@20"`` -> ``(Path("runs/uk-seq100"), 20)``: a run directory at one of its
    checkpoints (the reading tools take that form); a plain directory -> ``(dir, None)``."""
    text = str(run)
    head, sep, tail = text.rpartition("@")
    if sep and tail.isdigit() and not Path(text).exists():
        return Path(head), int(tail)
    return Path(text), None


def checkpoint_records(out_dir: str | Path) -> dict[int, dict[str, dict]]:
    """Every checkpoint record of a run directory: ``{checkpoint: {case_id: record}}`` (read
    only)."""
    out: dict[int, dict[str, dict]] = {}
    for path in result_files(out_dir, CHECKPOINTS):
        for rec in read_results(path, checkpoint_key).values():
            out.setdefault(int(rec["checkpoint"]), {})[str(rec["case_id"])] = rec
    return out


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value))


def same_edit(recorded: Mapping[str, Any], replayed: Mapping[str, Any]) -> bool:
    """Did a replayed edit compute what was recorded? Everything but the timing fields must be
    equal."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if "seconds" not in k}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(_plain(dict(recorded))) == strip(_plain(dict(replayed)))


def _answers_key(record: Mapping[str, Any]) -> str:
    """A line of ``sequence-answers.jsonl`` is one batch of one evaluation."""
    return f"{record['block']}:{record['edits']}:{record['batch']}"


class PartialAnswers:
    """The answers one evaluation of a block (after ``edits`` edits) has made so far, a line per
    batch of questions, so that an evaluation stopped part-way goes on from the first batch it
    lacks."""

    def __init__(self, file: ResultFile, block: int, edits: int) -> None:
        self.file, self.block, self.edits = file, block, edits

    def done(self, fingerprints: Sequence[str]) -> list[list[str]]:
        """The answers of the leading batches already made (``fingerprints``: one per batch of the
        evaluation, in order); the lines from the first missing or different batch on are
        dropped."""
        out: list[list[str]] = []
        for k, fp in enumerate(fingerprints):
            rec = self.file.records.get(
                _answers_key({"block": self.block, "edits": self.edits, "batch": k})
            )
            if rec is None or rec["fingerprint"] != fp:
                break
            out.append(list(rec["answers"]))
        kept = len(out)
        self.file.drop(
            lambda r: (
                not (r["block"] == self.block and r["edits"] == self.edits) or r["batch"] < kept
            )
        )
        return out

    def add(self, batch: int, fingerprint: str, answers: Sequence[str]) -> None:
        self.file.append(
            [
                {
                    "block": self.block,
                    "edits": self.edits,
                    "batch": batch,
                    "fingerprint": fingerprint,
                    "answers": list(answers),
                }
            ]
        )

    def clear(self) -> None:
        """The evaluation's records are written: its lines go."""
        self.file.drop(lambda r: not (r["block"] == self.block and r["edits"] == self.edits))


class SequenceLog:
    """The block in progress of one process: its edits' lines, its checkpoint records and its
    snapshot."""

    def __init__(self, out_dir: Path, rank: int, world: int) -> None:
        self.edits = ResultFile(out_dir / results_name(rank, world, SEQUENCE))
        self.checkpoints = ResultFile(
            out_dir / results_name(rank, world, CHECKPOINTS), checkpoint_key
        )
        self.answers = ResultFile(out_dir / results_name(rank, world, ANSWERS), _answers_key)
        self.state_dir = out_dir / STATE_DIR
        self.state = self.state_dir / results_name(rank, world, "state").replace(".jsonl", ".pt")
        for stale in stale_writer_tmps(self.state_dir):  # a snapshot write that was killed
            stale.unlink(missing_ok=True)

    # ------------------------------------------------------------------------------- recorded edits
    def recorded(self, block: int) -> list[dict]:
        """The recorded edits of ``block``, in the order they were made."""
        return sorted(
            (r for r in self.edits.records.values() if r.get("block") == block),
            key=lambda r: r["position"],
        )

    def append(self, record: Mapping[str, Any]) -> None:
        self.edits.append([record])

    def forget(self, keep: Callable[[dict], bool]) -> None:
        """Drop the recorded edits (and evaluations' answers) for which ``keep`` is false."""
        self.edits.drop(keep)
        self.answers.drop(keep)

    def partial(self, block: int, edits: int) -> PartialAnswers:
        """The answers made so far by the evaluation of ``block`` after ``edits`` edits."""
        return PartialAnswers(self.answers, block, edits)

    def forget_from(self, block: int, position: int) -> None:
        """Drop ``block``'s recorded edits from ``position`` on, and its checkpoints and
        evaluations' answers after ``position`` edits (``position`` 0: the block starts over)."""
        self.edits.drop(lambda r: not (r.get("block") == block and r["position"] >= position))
        self.checkpoints.drop(
            lambda r: not (r.get("block") == block and r["checkpoint"] > position)
        )
        self.answers.drop(lambda r: not (r["block"] == block and r["edits"] > position))

    def finish(self, block: int) -> None:
        """The block's records are in the results file: its edit lines, its evaluation's answers
        and its snapshot go."""
        self.edits.drop(lambda r: r.get("block") != block)
        self.answers.drop(lambda r: r["block"] != block)
        if self.state.is_file():
            self.state.unlink()
        self.block_state(block).unlink(missing_ok=True)

    # ---------------------------------------------------------------------------------- checkpoints
    def has_checkpoint(self, checkpoint: int, case_ids: list[str]) -> bool:
        return all(f"{checkpoint}:{cid}" in self.checkpoints.records for cid in case_ids)

    # ------------------------------------------------------------------------------------- snapshot
    def block_state(self, block: int) -> Path:
        """The snapshot file of ``block`` when several sequences run at once (one per sequence
        in progress; one sequence at a time keeps one file per process, ``state``)."""
        return self.state.with_name(f"{self.state.stem}.block{block}.pt")

    def save_state(
        self,
        model: Any,
        block: int,
        edits: int,
        weights0: Mapping[str, torch.Tensor],
        tensors: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        """The values after ``edits`` edits of every tensor the sequence changes (read from
        ``model``, or given as ``tensors``: then in the block's own file, ``block_state``), and
        their values before it."""
        path = self.state if tensors is None else self.block_state(block)
        if tensors is None:
            tensors = {name: model.get_parameter(name) for name in weights0}
        tensors = {name: t.detach().cpu().clone() for name, t in tensors.items()}
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with replacing(path) as tmp:
            torch.save(
                {
                    "block": block,
                    "edits": edits,
                    "tensors": tensors,
                    "weights0": {k: v.detach().cpu() for k, v in weights0.items()},
                },
                tmp,
            )

    def load_state(self, block: int, own_file: bool = False) -> dict | None:
        """The snapshot of ``block`` if there is a readable one (else None: the edits are
        replayed); ``own_file``: from the block's own file (``block_state``)."""
        path = self.block_state(block) if own_file else self.state
        if not path.is_file():
            return None
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except (
            Exception
        ) as err:  # a snapshot cut off by a kill, or from another torch: replay instead
            log.warning("%s cannot be read (%s); replaying the recorded edits instead", path, err)
            return None
        return state if state.get("block") == block else None
