"""The case loop of a benchmark run: edit, answer, restore, and the record of each case.

Single editing: every case is edited into the unedited model, evaluated, and the edit is undone.
Continual editing (``sequential=T``): T consecutive cases are edited one after another into the same
model, then all T are evaluated, then the model is restored; the next T start from the unedited
model. With ``checkpoints`` the cases edited so far are also evaluated after those edit counts of
each block (``checkpoints.jsonl``), and a block stopped part-way resumes after its last edit
(``benchmarks.records.sequence``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from hpse_easyedit.loading import check_placement
from hpse_easyedit.methods import MethodSpec
from hpse_easyedit.training import EditDivergedError

from ..records.rollouts import pack_rounds
from ..records.sequence import PartialAnswers, SequenceLog, same_edit
from ..records.store import ResultFile, json_plain
from ..tasks.probe import LocalityProbe
from ..tasks.task import Task
from .run_dir import write_kept
from .scorer import Scorer

__all__ = ["CaseLoop", "Editing", "Progress", "SequentialLoop", "SingleLoop"]

log = logging.getLogger(__name__)

#: progress(cases finished, postfix for the progress bar or None)
Progress = Callable[[int, "Mapping[str, str] | None"], None]


@dataclass
class Editing:
    """One method on one model: the model loaded on first need, one case's edit, the answers to
    cases' questions, the undo, and what a case's record says about its edit."""

    method: MethodSpec
    hp: Any
    model_name: str
    task: Task
    max_new_tokens: int
    batch_size: int
    store_rollouts: bool
    #: draw a progress bar over the answers of an evaluation longer than one batch (the main
    #: process's)
    show_progress: bool = True
    model: Any = field(default=None, init=False)
    tok: Any = field(default=None, init=False)

    def ensure_model(self) -> None:
        if self.model is None:
            t0 = time.time()
            self.model, self.tok = self.method.load_model(self.hp)
            check_placement(self.model)
            log.info("loaded %s in %.1f s", self.model_name, time.time() - t0)

    def unedited(self) -> tuple[Any, Any]:
        """The unedited model and its tokenizer (loaded now if need be)."""
        self.ensure_model()
        return self.model, self.tok

    def edit(self, model: Any, case: Mapping[str, Any]) -> tuple[Any, float]:
        t0 = time.time()
        try:
            res = self.method.edit(model, self.tok, [dict(r) for r in case["requests"]], self.hp)
        except EditDivergedError as err:
            err.seconds = time.time() - t0
            raise
        return res, time.time() - t0

    def restore(self, model: Any, weights_copy: Any) -> None:
        """Undo the edits whose values before are ``weights_copy``; the unedited model is this one's
        again."""
        self.model = self.method.restore(model, weights_copy)

    def answers(
        self,
        model: Any,
        cases: Sequence[Mapping[str, Any]],
        results: Sequence[Any] = (),
        desc: str = "answers",
        partial: PartialAnswers | None = None,
    ) -> list[list[str]]:
        """Greedy chat-template answers to every case's questions, batched across the cases (under
        the passages' system prompt when the edit results carry a context: the IN_CONTEXT
        reference); more than one batch of them under a progress bar named ``desc``. ``partial``:
        each batch's answers are stored there as it finishes, and the batches it already holds are
        not made again (the same batches, so the same answers, as one uninterrupted call)."""
        from tqdm.auto import tqdm

        from hpse_easyedit import generate_answers

        from .references import answer_system

        questions = [self.task.questions(c) for c in cases]
        flat_questions = [q for qs in questions for q in qs]
        system = answer_system(model, results, self.hp)
        size = self.batch_size
        prints, made = [], []  # without ``partial`` (single editing) nothing is kept
        if partial is not None:
            batches = range(0, len(flat_questions), size)
            prints = [_fingerprint(system, flat_questions[s : s + size]) for s in batches]
            made = partial.done(prints)
        if made:
            log.info(
                "%s: %d of %d batches were answered before the stop", desc, len(made), len(prints)
            )
        made_flat = [a for batch in made for a in batch]
        stored = len(made)

        def store(answers: list[str]) -> None:
            nonlocal stored
            partial.add(stored, prints[stored], answers)
            stored += 1

        with tqdm(
            total=len(flat_questions),
            initial=len(made_flat),
            desc=desc,
            unit="answer",
            leave=False,
            dynamic_ncols=True,
            disable=not self.show_progress or len(flat_questions) <= size,
        ) as bar:
            # the rest starts at a batch boundary: the same batches as one uninterrupted call
            flat = made_flat + generate_answers(
                model,
                self.tok,
                flat_questions[len(made_flat) :],
                max_new_tokens=self.max_new_tokens,
                batch_size=size,
                system=system,
                template_kwargs=getattr(self.hp, "chat_template_kwargs", None),
                static_decode=getattr(self.hp, "static_decode", False),
                stop_every=getattr(self.hp, "decode_stop_every", 8),
                progress=bar.update,
                on_batch=store if partial is not None else None,
            )
        out, pos = [], 0
        for qs in questions:
            out.append(list(flat[pos : pos + len(qs)]))
            pos += len(qs)
        return out

    def edit_record(
        self, index: int, case: Mapping[str, Any], res: Any, seconds: float, block: int | None
    ) -> dict:
        """What a case's record says about its edit (everything but the scores)."""
        rec: dict[str, Any] = {
            "case_id": case["case_id"],
            "index": index,
            "block": block,
            "subjects": [r["subject"] for r in case["requests"]],
            "edit_seconds": round(seconds, 3),
            "rounds": json_plain(list(getattr(res, "rounds", None) or [])),
        }
        if (
            getattr(res, "algorithm_seconds", None) is not None
        ):  # EasyEdit's own algorithm, the rest is integration
            rec["algorithm_seconds"] = round(res.algorithm_seconds, 3)
        rollouts = pack_rounds(getattr(res, "rollouts", None)) if self.store_rollouts else None
        if rollouts is not None:
            rec["rollouts"] = rollouts
        return rec

    @staticmethod
    def failed_record(
        index: int, case: Mapping[str, Any], err: Any, block: int | None, seconds: float = 0.0
    ) -> dict:
        """A case whose edit diverged or failed (``err``: the error, or its message): why, and no
        scores (left out of every mean, counted as failed)."""
        log.warning("case %s: %s", case["case_id"], err)
        return {
            "case_id": case["case_id"],
            "index": index,
            "block": block,
            "subjects": [r["subject"] for r in case["requests"]],
            "edit_seconds": round(getattr(err, "seconds", seconds), 3),
            "rounds": [],
            "failed": str(err),
        }


@dataclass
class CaseLoop:
    """What a loop over a process's cases works with: the editing, the cases, the scorer, the MMLU
    probe and this process's results file."""

    editing: Editing
    cases: Any
    scorer: Scorer
    probe: LocalityProbe
    results: ResultFile


@dataclass
class SingleLoop(CaseLoop):
    """Single editing: each case edited into the unedited model, answered, scored, undone,
    recorded. With ``cases_at_once`` B > 1 the cases are edited B at a time in one batched pass
    (``MethodSpec.edit_cases``), then each is put in, answered, scored, undone and recorded as a
    solo edit's case is."""

    cases_at_once: int = 1

    def run(self, todo: list[int], progress: Progress, mine: Sequence[int] = ()) -> None:
        """Edit the cases ``todo`` (indices into ``cases``). ``mine``: every case of this process,
        done or not, in order: batches are fixed windows of it, so a batch cut short by a stop is
        edited again whole (the same batch, so the same float rounding, as one uninterrupted run)
        and only its cases without a record are recorded."""
        if self.cases_at_once > 1:
            self._run_batched(todo, progress, list(mine) or list(todo))
            return
        e = self.editing
        for i in todo:
            case = self.cases[i]
            try:
                res, seconds = e.edit(e.model, case)
            except EditDivergedError as err:
                e.restore(err.model, err.weights_copy)
                write_kept(self.results, [e.failed_record(i, case, err, None)])
                progress(1, None)
                continue
            answers = e.answers(res.model, [case], [res])[0]
            mmlu_after = self.probe.measure(res.model, e.tok) if self.probe.due(i) else None
            e.restore(res.model, res.weights_copy)
            rec = e.edit_record(i, case, res, seconds, None)
            rec.update(self.scorer.score(case, answers))
            if mmlu_after is not None:
                rec["MMLU_after"] = mmlu_after
            self._finish(rec, progress)

    def _finish(self, rec: dict, progress: Progress) -> None:
        """Write a scored case's record, stop if the judge refuses, advance the progress bar."""
        write_kept(self.results, [rec])
        self.scorer.stop_if_refused()
        progress(
            1,
            {m: f"{100 * rec[m]:.0f}" for m in self.editing.task.metrics if rec.get(m) is not None},
        )

    def _run_batched(self, todo: list[int], progress: Progress, mine: list[int]) -> None:
        e, size, wanted = self.editing, self.cases_at_once, set(todo)
        batches = [mine[s : s + size] for s in range(0, len(mine), size)]
        for batch in (b for b in batches if wanted.intersection(b)):
            t0 = time.time()
            edits = e.method.edit_cases(
                e.model,
                e.tok,
                [[dict(r) for r in self.cases[i]["requests"]] for i in batch],
                e.hp,
            )
            seconds = (time.time() - t0) / len(batch)  # each case's share of the batch
            for i, res in zip(batch, edits):
                if i not in wanted:
                    continue
                case = self.cases[i]
                if not res.ok:
                    write_kept(self.results, [e.failed_record(i, case, res.error, None, seconds)])
                    progress(1, None)
                    continue
                model = e.method.resume(e.model, e.hp, res.tensors)
                answers = e.answers(model, [case], [res])[0]
                mmlu_after = self.probe.measure(model, e.tok) if self.probe.due(i) else None
                e.restore(model, res.start)
                rec = e.edit_record(i, case, res, seconds, None)
                rec.update(self.scorer.score(case, answers))
                if mmlu_after is not None:
                    rec["MMLU_after"] = mmlu_after
                self._finish(rec, progress)


@dataclass
class SequentialLoop(CaseLoop):
    """Continual editing: blocks of T cases edited one after another, evaluated together (and at the
    checkpoints part-way), then undone; a block in progress resumes from its snapshot or by
    replaying."""

    sequence: SequenceLog
    checkpoints: Sequence[int]
    #: sequences edited side by side (``MethodSpec.edit_cases``): edit j of each is made in one
    #: batched pass, each sequence its own state
    sequences_at_once: int = 1

    def run(self, blocks: list[tuple[int, list[int]]], progress: Progress) -> None:
        if self.sequences_at_once > 1:
            size = self.sequences_at_once
            for s in range(0, len(blocks), size):
                _Lockstep(self, blocks[s : s + size]).run(progress)
            return
        e, snapshots = self.editing, self.editing.method.resume is not None
        for b, block in blocks:
            # results: the edits' results so far (IN_CONTEXT's passages)
            model, weights0, edits, results = self._resume_block(b, block)
            self.checkpoint(b, block, len(edits), model, results)
            for j in range(len(edits), len(block)):
                model, weights0, edit, res = self._sequence_edit(model, weights0, b, j, block[j])
                results += [res] if res is not None else []
                edits.append(edit)
                write_kept(self.sequence.edits, [edit])
                if snapshots and len(block) > 1:
                    self.sequence.save_state(model, b, j + 1, weights0)
                self.checkpoint(b, block, j + 1, model, results)
            partial = self.sequence.partial(b, len(block))
            answers = e.answers(
                model,
                [self.cases[i] for i in block],
                results,
                desc=f"block {b}: answers after {len(block)} edits",
                partial=partial,
            )
            mmlu_after = self.probe.measure(model, e.tok) if self.probe.due(b) else None
            e.restore(model, weights0)
            records = [{k: v for k, v in edit.items() if k != "position"} for edit in edits]
            for i, a, rec in zip(block, answers, records):
                if "failed" not in rec:
                    self._scored(rec, self.cases[i], a, mmlu_after)
            write_kept(self.results, records)
            self.sequence.finish(b)
            self.scorer.stop_if_refused()
            progress(len(block), None)

    def _scored(self, rec: dict, case: Mapping[str, Any], answers: Any, mmlu: float | None) -> None:
        """``rec`` with the case's scores, and the MMLU measured after the edits (if it was)."""
        rec.update(self.scorer.score(case, answers))
        if mmlu is not None:
            rec["MMLU_after"] = mmlu

    def _resume_block(self, b: int, block: list[int]) -> tuple[Any, Any, list[dict], list[Any]]:
        """The model as the recorded edits of block ``b`` left it, the values before its first edit,
        and those edits' records: loaded from the snapshot, or the edits replayed (each checked
        against its record; from the first that differs on, the block is redone; the snapshot
        rewritten after each that matches, so a replay stopped part-way resumes after it)."""
        e, edits, results = self.editing, self.sequence.recorded(b), []
        if not edits:  # checkpoints and answers an earlier try left belong to other edits
            self.sequence.forget_from(b, 0)
            return e.model, None, [], []
        model, weights0, done = e.model, None, 0
        state = self.sequence.load_state(b) if e.method.resume is not None else None
        if state is not None and 0 < state["edits"] <= len(edits):
            model = e.method.resume(e.model, e.hp, state["tensors"])
            weights0, done = state["weights0"], state["edits"]
            log.info(
                "block %d: resuming after edit %d of %d from %s",
                b,
                done,
                len(block),
                self.sequence.state,
            )
        if done < len(edits):
            log.info(
                "block %d: replaying %d recorded edit(s) (%d to %d) without evaluating them",
                b,
                len(edits) - done,
                done + 1,
                len(edits),
            )
        for j in range(done, len(edits)):
            model, weights0, replayed, res = self._sequence_edit(model, weights0, b, j, block[j])
            results += [res] if res is not None else []
            if not same_edit(edits[j], replayed):
                log.warning(
                    "block %d: edit %d computes other values than recorded (another machine or "
                    "kernels?); its record and every later one of the block are redone",
                    b,
                    j + 1,
                )
                self.sequence.forget_from(b, j)
                edits = [*edits[:j], replayed]
                write_kept(self.sequence.edits, [replayed])
                if e.method.resume is not None:
                    self.sequence.save_state(model, b, j + 1, weights0)
                return model, weights0, edits, results
            if e.method.resume is not None:  # a replay stopped part-way goes on from here
                self.sequence.save_state(model, b, j + 1, weights0)
        return model, weights0, edits, results

    def _sequence_edit(
        self, model: Any, weights0: Any, b: int, j: int, i: int
    ) -> tuple[Any, Any, dict, Any]:
        """Edit ``j`` of block ``b`` (case ``i``): the model after it, the values before the block's
        first edit, the edit's record and its result (None when it diverged: the model is then as
        before this edit)."""
        e = self.editing
        try:
            res, seconds = e.edit(model, self.cases[i])
        except EditDivergedError as err:
            return (
                err.model,
                err.weights_copy if weights0 is None else weights0,
                {**e.failed_record(i, self.cases[i], err, b), "position": j},
                None,
            )
        weights0 = res.weights_copy if weights0 is None else weights0
        return (
            res.model,
            weights0,
            {**e.edit_record(i, self.cases[i], res, seconds, b), "position": j},
            res,
        )

    def checkpoint(
        self, b: int, block: list[int], edits: int, model: Any, results: Sequence[Any]
    ) -> None:
        """At a checkpoint, the scores of the block's first ``edits`` cases on the model as edited
        so far."""
        if edits not in self.checkpoints or edits >= len(block):
            return
        done = block[:edits]
        ids = [str(self.cases[i]["case_id"]) for i in done]
        if self.sequence.has_checkpoint(edits, ids):
            return
        failed = {
            str(r["case_id"]): r["failed"] for r in self.sequence.recorded(b) if "failed" in r
        }
        t0 = time.time()
        partial = self.sequence.partial(b, edits)
        answers = self.editing.answers(
            model,
            [self.cases[i] for i in done],
            results,
            desc=f"block {b}: checkpoint after {edits} edits",
            partial=partial,
        )
        mmlu_after = self.probe.measure(model, self.editing.tok) if self.probe.enabled else None
        records = [_checkpoint_record(self.cases[i], i, b, edits) for i in done]
        for i, a, rec in zip(done, answers, records):
            if str(rec["case_id"]) in failed:
                rec["failed"] = failed[str(rec["case_id"])]
            else:
                self._scored(rec, self.cases[i], a, mmlu_after)
        write_kept(self.sequence.checkpoints, records)
        partial.clear()
        self.scorer.stop_if_refused()
        log.info(
            "block %d: checkpoint after %d edits evaluated in %.0f s", b, edits, time.time() - t0
        )


class _Lockstep:
    """Several sequences of a continual run side by side: edit j of every sequence in one batched
    pass (``MethodSpec.edit_cases``, each sequence starting from its own tensors), then each
    sequence's checkpoints and final evaluation as ``SequentialLoop`` makes them, its model put
    together from its tensors (``MethodSpec.resume``) and undone after. Each sequence keeps its
    own snapshot after every edit (``SequenceLog.block_state``), which a resume starts from; a
    sequence with recorded edits but no matching snapshot starts over."""

    def __init__(self, loop: SequentialLoop, blocks: list[tuple[int, list[int]]]) -> None:
        self.loop, self.blocks = loop, blocks
        self.tensors: dict[int, dict | None] = {}  # block -> its edited tensors (None: unedited)
        self.start: dict[int, dict | None] = {}  # block -> the values before its first edit
        self.edits: dict[int, list[dict]] = {}
        self.results: dict[int, list] = {}

    def _resume(self, b: int, block: list[int]) -> None:
        seq = self.loop.sequence
        edits = seq.recorded(b)
        state = seq.load_state(b, own_file=True) if edits else None
        self.tensors[b], self.start[b], self.edits[b], self.results[b] = None, None, [], []
        if state is not None and state["edits"] == len(edits):
            self.tensors[b], self.start[b], self.edits[b] = (
                state["tensors"],
                state["weights0"],
                edits,
            )
            log.info("block %d: resuming after edit %d of %d", b, len(edits), len(block))
        else:  # records without their snapshot, or another try's checkpoints: start over
            seq.forget_from(b, 0)

    def _model(self, b: int) -> Any:
        """The model as block ``b``'s edits so far left it (the unedited one before any)."""
        e = self.loop.editing
        tensors = self.tensors[b]
        return e.model if tensors is None else e.method.resume(e.model, e.hp, tensors)

    def _undo(self, b: int, model: Any) -> None:
        if self.tensors[b] is not None:
            self.loop.editing.restore(model, self.start[b])

    def _checkpoint(self, b: int, block: list[int]) -> None:
        done = len(self.edits[b])
        if done not in self.loop.checkpoints or done >= len(block):
            return
        model = self._model(b)
        self.loop.checkpoint(b, block, done, model, self.results[b])
        self._undo(b, model)

    def run(self, progress: Progress) -> None:
        loop, e = self.loop, self.loop.editing
        for b, block in self.blocks:
            self._resume(b, block)
            self._checkpoint(b, block)
        while True:
            due = [(b, block) for b, block in self.blocks if len(self.edits[b]) < len(block)]
            if not due:
                break
            step = min(len(self.edits[b]) for b, _ in due)
            due = [(b, block) for b, block in due if len(self.edits[b]) == step]
            t0 = time.time()
            done = e.method.edit_cases(
                e.model,
                e.tok,
                [[dict(r) for r in loop.cases[block[step]]["requests"]] for _, block in due],
                e.hp,
                starts=[self.tensors[b] for b, _ in due],
            )
            seconds = (time.time() - t0) / len(due)
            for (b, block), res in zip(due, done):
                i = block[step]
                if res.ok:
                    record = e.edit_record(i, loop.cases[i], res, seconds, b)
                    self.tensors[b] = res.tensors
                    self.results[b].append(res)
                else:
                    record = e.failed_record(i, loop.cases[i], res.error, b, seconds)
                self.start[b] = self.start[b] if self.start[b] is not None else res.start
                edit = {**record, "position": step}
                self.edits[b].append(edit)
                write_kept(loop.sequence.edits, [edit])
                if len(block) > 1:
                    loop.sequence.save_state(
                        None, b, step + 1, self.start[b], tensors=self.tensors[b] or self.start[b]
                    )
                self._checkpoint(b, block)
        for b, block in self.blocks:
            self._finish(b, block, progress)

    def _finish(self, b: int, block: list[int], progress: Progress) -> None:
        """Block ``b``'s final evaluation and records, as ``SequentialLoop.run`` writes them."""
        loop, e = self.loop, self.loop.editing
        model = self._model(b)
        answers = e.answers(
            model,
            [loop.cases[i] for i in block],
            self.results[b],
            desc=f"block {b}: answers after {len(block)} edits",
            partial=loop.sequence.partial(b, len(block)),
        )
        mmlu_after = loop.probe.measure(model, e.tok) if loop.probe.due(b) else None
        self._undo(b, model)
        records = [{k: v for k, v in edit.items() if k != "position"} for edit in self.edits[b]]
        for i, a, rec in zip(block, answers, records):
            if "failed" not in rec:
                loop._scored(rec, loop.cases[i], a, mmlu_after)
        write_kept(loop.results, records)
        loop.sequence.finish(b)
        loop.scorer.stop_if_refused()
        progress(len(block), None)


def _fingerprint(system: str | None, questions: Sequence[str]) -> str:
    """What one batch's answers depend on besides the model: its questions and system prompt."""
    text = json.dumps([system, list(questions)], ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _checkpoint_record(case: Mapping[str, Any], i: int, b: int, edits: int) -> dict[str, Any]:
    """The head of case ``i``'s record at the checkpoint after ``edits`` edits of block ``b``."""
    return {
        "case_id": case["case_id"],
        "index": i,
        "block": b,
        "checkpoint": edits,
        "subjects": [r["subject"] for r in case["requests"]],
    }
