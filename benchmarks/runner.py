"""Run an editing method over UnKEBench or MQuAKE-uns, resumably, and summarise it in the paper's layout.

Single editing: every case is edited into the unedited model, evaluated, and the edit is undone.
Continual editing (``sequential=T``): T consecutive cases are edited one after another into the same
model, then all T are evaluated, then the model is restored; the next T start from the unedited model.
With ``checkpoints=[10, 20, 50]`` the cases edited so far are also evaluated after the 10th, 20th and
50th edit of each sequence (``checkpoints.jsonl``), so one sequence of T = 100 gives the curve at
T = 10, 20, 50 and 100; a sequence stopped part-way resumes after its last edit (``benchmarks.sequence``).

Each finished case (in continual mode, each finished block of T) is appended to ``results.jsonl`` at
once, so a killed run loses only the work in flight, and rerunning with the same output directory
resumes. ``summary.json`` and ``table.md`` are rewritten from all records at the end.

Under ``accelerate launch --num_processes N`` (see ``benchmarks.distributed`` and docs/SCALE_OUT.md)
process R runs every N-th case (every N-th block of T in continual mode) starting at R, into its own
``results.rankR-of-N.jsonl``; after ``wait_for_everyone`` the results files are merged, and the main
process writes ``summary.json`` and ``table.md`` only if every case is there exactly once.

What differs between benchmarks (data file and loader, generation limit, judge, MMLU) is the ``Task``'s
(``benchmarks.tasks``); what a rerun may change is ``store.config_policy``; the command line is
``benchmarks.cli``, which imports this module (never the reverse).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Mapping, Sequence

from .datasets import (
    EDIT_PROMPT,
    SUBJECT_MODES,
    file_sha256,
    load_mmlu_subset,
)
from hpse_easyedit.errors import (
    ENVIRONMENT_ERRNOS,
    Interrupted,
    UsageError,
    check_new_dir,
    check_writable,
    choice_text,
)
from hpse_easyedit.locks import writer_lock
from hpse_easyedit.training import EditDivergedError

from .distributed import DEFAULT_TIMEOUT, LaunchError, ProcessContext, process_context
from .editors import Editor, editor_for_hparams_file, method_label
from .judge import JUDGE_KINDS, LEXICAL_JUDGE_NAME, ChatClient, Judge, JudgeError, JudgeRefusedError, JudgeSettings, LLMJudge, make_judge
from .metrics import mean
from .paths import JUDGE_CACHE, default_cache_dir, default_data_dir
from .report import judge_note, paper_table
from .rollouts import pack_rounds, stepin_rate_by_round
from .store import (
    CONFIG,
    KERNEL_KEYS,
    PLACEMENT_KEYS,
    IncompleteRunError,
    ResultFile,
    check_run_config,
    config_policy,
    json_plain,
    merge_results,
    read_results,
    result_files,
    results_name,
    write_json_atomic,
    write_text_atomic,
)
from .sequence import SequenceLog, checkpoint_records, same_edit
from .tasks import TASKS, Task, unjudged_metrics

__all__ = [
    "PLACEMENT_KEYS", "RunOptions", "config_policy", "default_out_dir", "failed_note", "run_benchmark",
    "stepin_rate_by_round", "unjudged_note",
]

log = logging.getLogger(__name__)


@dataclass
class RunOptions:
    """Everything one benchmark run depends on (see ``add_run_arguments`` for the meaning of each)."""

    benchmark: str
    hparams: str
    overrides: list[str] = field(default_factory=list)
    data_dir: str | None = None
    out_dir: str | None = None
    label: str | None = None
    limit: int | None = None
    cases: list[str] | None = None
    sequential: int | None = None
    checkpoints: list[int] | None = None
    batch_size: int = 8
    max_new_tokens: int | None = None
    data_file: str | None = None
    subjects: str = "auto"
    subjects_file: str | None = None
    judge: str = "auto"
    judge_settings: JudgeSettings = field(default_factory=JudgeSettings)
    cache_dir: str | None = None
    mmlu_n: int = 100
    mmlu_shots: int = 5
    mmlu_seed: int = 0
    mmlu_batch_size: int = 4
    mmlu_every: int = 1
    dist_timeout_hours: float = DEFAULT_TIMEOUT.total_seconds() / 3600
    store_rollouts: bool = True
    retry_failed: bool = False

    def __post_init__(self) -> None:
        """Every option range is checked here, before any file is read or model loaded (``UsageError``)."""
        if self.benchmark not in TASKS:
            raise UsageError(f"benchmark must be one of {sorted(TASKS)}, got {self.benchmark!r}")
        at_least = [
            ("--sequential", self.sequential, 1, "cases edited one after another"),
            ("--limit", self.limit, 1, "the first N cases"),
            ("--batch-size", self.batch_size, 1, "answers generated at once"),
            ("--max-answer-tokens", self.max_new_tokens, 1, "answer length cap"),
            ("--mmlu-n", self.mmlu_n, 0, "0 skips MMLU"),
            ("--mmlu-shots", self.mmlu_shots, 0, "dev examples per MMLU prompt"),
            ("--mmlu-batch-size", self.mmlu_batch_size, 1, "MMLU prompts at once"),
            ("--mmlu-every", self.mmlu_every, 1, "1 = MMLU after every edit"),
            ("--judge-max-attempts", self.judge_settings.max_attempts, 1, "requests per judge question"),
        ]
        for option, value, minimum, what in at_least:
            if value is not None and value < minimum:
                raise UsageError(f"{option} must be >= {minimum} ({what}), got {value}")
        for option, value in (("--dist-timeout-hours", self.dist_timeout_hours), ("--judge-timeout", self.judge_settings.timeout)):
            if not value > 0:
                raise UsageError(f"{option} must be > 0, got {value}")
        if self.cases is not None:
            self.cases = [str(c).strip() for c in self.cases if str(c).strip()]
            if not self.cases:
                raise UsageError("--cases names no case id; give comma-separated ids, e.g. --cases 6,24,68")
            if self.sequential:
                raise UsageError("--cases picks single cases; continual editing (--sequential) edits consecutive "
                                 "cases, so use --limit there")
        if self.checkpoints is not None:
            if not self.sequential:
                raise UsageError("--checkpoints evaluates a continual sequence part-way; give --sequential T with it")
            bad = [c for c in self.checkpoints if not 1 <= c < self.sequential]
            if bad or not self.checkpoints:
                raise UsageError(f"--checkpoints must be edit counts from 1 to {self.sequential - 1} (T itself is "
                                 f"always evaluated), e.g. 10,20,50 with --sequential 100; got {bad or 'none'}")
            self.checkpoints = sorted(set(self.checkpoints))
        if self.subjects not in SUBJECT_MODES:
            raise UsageError(f"--subjects must be {choice_text(SUBJECT_MODES)}, got {self.subjects!r}")
        if self.judge not in JUDGE_KINDS:
            raise UsageError(f"--judge must be {choice_text(JUDGE_KINDS)}, got {self.judge!r}")
        check_new_dir("--out", self.out_dir, may_hold_files=True)
        check_new_dir("--cache-dir", self.cache_dir, may_hold_files=True)


def _computing(overrides: Sequence[str]) -> list[str]:
    """The overrides that change what a run computes: placement overrides (``device=...``) say only where it runs,
    kernel overrides (``fast_decode=...``) only which kernels compute it."""
    return [o for o in overrides if o.split("=", 1)[0].strip() not in PLACEMENT_KEYS + KERNEL_KEYS]


def default_out_dir(benchmark: str, hparams: str, overrides: Sequence[str]) -> Path:
    """``runs/<benchmark>/<hparams name>[+key=value...]``: distinct overrides get distinct directories
    (placement overrides such as ``device=cuda`` do not: moving a run to another device resumes it)."""
    name = Path(hparams).stem + "".join(f"+{o}" for o in _computing(overrides))
    return Path("runs") / benchmark / re.sub(r"[^\w.+=-]+", "_", name)


def _check_placement(model: Any, ctx: ProcessContext) -> None:
    """Refuse a model_parallel placement that offloads weights to CPU or disk: those cannot be edited."""
    device_map = getattr(model, "hf_device_map", None)
    if not device_map:
        return
    places = {str(v) for v in device_map.values()}
    on_gpu = {p for p in places if p not in ("cpu", "disk")}
    offloaded = sorted(n for n, v in device_map.items() if str(v) == "disk" or (on_gpu and str(v) == "cpu"))
    if offloaded:
        gpus = f"GPUs {','.join(ctx.gpus)}" if ctx.gpus else "the visible GPUs"
        raise LaunchError(
            f"model_parallel: the model does not fit on {gpus}; device_map='auto' offloaded {len(offloaded)} "
            f"module(s) to CPU/disk (first: {offloaded[0]}), and offloaded weights cannot be edited. Give each process "
            "more GPUs (fewer processes per host), use a smaller dtype, or free GPU memory"
        )


class _Run:
    """One benchmark run: options resolved into data, judge, this process's share of the cases and (lazily) the model."""

    def __init__(self, opts: RunOptions, context: ProcessContext | None = None) -> None:
        self.opts = opts
        self.task: Task = TASKS[opts.benchmark]
        self.data_dir = Path(opts.data_dir) if opts.data_dir else default_data_dir()
        self.cache_dir = Path(opts.cache_dir) if opts.cache_dir else default_cache_dir()
        self._check_data_paths()
        self.editor: Editor = editor_for_hparams_file(opts.hparams)
        requested = self.editor.load_hparams(opts.hparams, opts.overrides)
        if self.editor.preflight is not None:  # e.g. covariance statistics that cannot be had: refused before loading
            self.editor.preflight(requested)
        self.hp_dict = json_plain(self.editor.hparams_dict(requested))
        self.ctx = context or process_context(
            model_parallel=bool(self.hp_dict.get("model_parallel")), timeout=timedelta(hours=opts.dist_timeout_hours),
        )
        # The recorded hparams (config.json, summary.json) are the requested ones; each process of a
        # multi-process launch runs them on the device accelerate gave it.
        self.hp = requested if self.ctx.device is None else self.editor.load_hparams(
            opts.hparams, [*opts.overrides, f"device={self.ctx.device}"])
        self.policy = config_policy(requested)
        self.method = method_label(self.editor.name, self.hp_dict)
        self.label = opts.label or f"{self.method} ({Path(opts.hparams).stem})" + "".join(
            f" {o}" for o in _computing(opts.overrides))
        self.max_new_tokens = opts.max_new_tokens or self.task.default_max_new_tokens
        settings = JudgeSettings(**{**opts.judge_settings.__dict__, "cache_path": str(self.cache_dir / JUDGE_CACHE)})
        self.judge: Judge | None = make_judge(opts.judge, settings, warn=False) if self.task.needs_judge else None
        self.client: ChatClient | None = self.judge.client if isinstance(self.judge, LLMJudge) else None
        if self.client is None and not self.task.needs_judge and opts.judge != "lexical" and settings.resolve().configured:
            self.client = ChatClient(settings)  # generates passages for MQuAKE files that have none
        self.out_dir = Path(opts.out_dir) if opts.out_dir else default_out_dir(opts.benchmark, opts.hparams, opts.overrides)
        self.mmlu_enabled = self.task.measures_mmlu and opts.mmlu_n > 0
        self.store: ResultFile | None = None
        self.model: Any = None
        self.tok: Any = None

    def _check_data_paths(self) -> None:
        """The data directory and the files the options name exist (before anything is loaded)."""
        o = self.opts
        if not self.data_dir.is_dir():
            raise UsageError(
                f"--data {self.data_dir}: no such directory; point --data (or $HPSE_DATA_DIR) at the benchmark data "
                "(README, section Data)"
            )
        option = self.task.file_option
        path = self.task.data_path(self.data_dir, o.data_file)
        if not path.is_file():
            raise UsageError(f"{option} {path}: no such file; check --data and {option} (README, section Data)")
        if o.subjects_file and not Path(o.subjects_file).is_file():
            raise UsageError(f"--subjects-file {o.subjects_file}: no such file; give an id -> subject JSON file")

    def _probe_judge(self) -> None:
        """One cheap request to the judge endpoint before the first edit (``JudgeError`` when it is not there)."""
        if self.client is not None:
            self.client.probe()
            log.info("judge: %s at %s", self.client.name, self.client.settings.base_url or "the OpenAI default URL")
        if self.judge is not None and self.judge.name == LEXICAL_JUDGE_NAME and self.opts.judge == "auto":
            log.warning(
                "no judge endpoint configured (--judge-base-url / HPSE_JUDGE_BASE_URL / OPENAI_BASE_URL or an API "
                "key): scoring UnKEBench with the offline LEXICAL FALLBACK judge; its Jnt/Dmp are not the paper's"
            )

    def _load_data(self) -> list[Path]:
        o = self.opts
        # the requests carry the editor's own editing prompt, so `--set editing_prompt=...` takes effect
        template = self.hp_dict.get("editing_prompt") or EDIT_PROMPT
        self.cases, paths = self.task.load(self.data_dir, o, self.client, self.cache_dir, template)
        if o.cases:
            ids = [str(c) for c in self.cases["case_id"]]
            missing = [c for c in o.cases if c not in set(ids)]
            if missing:
                within = f" among the first {o.limit} cases (--limit)" if o.limit else ""
                raise UsageError(f"--cases: no case_id {', '.join(missing)}{within} in {paths[0]}; "
                                 "check the ids (the case_id field of the data file)" + (" or raise --limit" if within else ""))
            wanted = set(o.cases)
            self.cases = self.cases.select([i for i, c in enumerate(ids) if c in wanted])
        if len(self.cases) == 0:
            raise UsageError(f"no cases selected from {paths[0]} (limit {o.limit}); check the data file")
        return paths

    def _config(self, data_paths: list[Path]) -> dict:
        """What the results depend on; a rerun into the same directory must match it (``limit`` may grow)."""
        o = self.opts
        config: dict[str, Any] = {
            "benchmark": self.task.name,
            "editor": self.editor.name,
            "hparams": self.hp_dict,
            "data": {p.name: file_sha256(p) for p in data_paths},
            "mode": "sequential" if o.sequential else "single",
            "sequential": o.sequential,
            "max_new_tokens": self.max_new_tokens,
        }
        if o.checkpoints:  # only when set: the directories of runs without checkpoints keep resuming
            config["checkpoints"] = o.checkpoints
        config.update(self.task.run_config(o, self.judge, self.mmlu_enabled))
        return config

    # ---------------------------------------------------------------------------------------- results files
    def _units(self) -> list[list[int]]:
        """What one process runs at a time: single cases, or in continual mode whole blocks of T cases."""
        n, T = len(self.cases), self.opts.sequential
        if T:
            return [list(range(s, min(s + T, n))) for s in range(0, n, T)]
        return [[i] for i in range(n)]

    def _open_results(self, ids: list[str]) -> set[str]:
        """Check config.json, open this process's results file; returns the case ids already done.

        The main process runs this before the others (``main_first``): it records config.json, cuts torn
        last lines off every results file and, in continual mode, drops the records of unfinished
        blocks, so no file changes under the others' feet but their own.
        """
        main, config = self.ctx.is_main, self._config(self._data_paths)
        if main:
            self._forget_config_of_a_run_that_never_started()
        check_run_config(self.out_dir, config, write=main, policy=self.policy)
        own = self.out_dir / results_name(self.ctx.rank, self.ctx.world)
        retry_blocks: set[int] = set()
        if main:
            files = {p: ResultFile(p) for p in result_files(self.out_dir)}
            merge_results(self.out_dir, ids, require_all=False)  # refuses a case recorded twice
            if self.opts.retry_failed:
                retry_blocks = self._drop_failed(files, ids)
            if self.opts.sequential:
                done = {cid for f in files.values() for cid in f.records}
                selected = set(ids)
                whole = {ids[i] for blk in self._units() if all(ids[j] in done for j in blk) for i in blk}
                dropped = [cid for f in files.values()
                           for cid in f.drop(lambda r: str(r["case_id"]) in whole or str(r["case_id"]) not in selected)]
                if dropped:
                    log.warning("dropping %d record(s) of an unfinished block; the block is redone", len(dropped))
        self.store = ResultFile(own)
        if self.opts.sequential:
            self.sequence = SequenceLog(self.out_dir, self.ctx.rank, self.ctx.world)
            finished = {b for b, blk in enumerate(self._units()) if all(ids[i] in self.store.records for i in blk)}
            self.sequence.forget(lambda r: r.get("block") not in finished)  # moved to results, killed before dropping
            self.sequence.checkpoints.drop(lambda r: r.get("block") not in retry_blocks)
        # Files of this launch's other processes hold only their cases, and are being written to.
        peers = {results_name(r, self.ctx.world) for r in range(self.ctx.world)} - {own.name}
        done = set(self.store.records)
        for path in result_files(self.out_dir):
            if path.name not in peers and path != own:
                done |= set(read_results(path))
        return done

    def _drop_failed(self, files: Mapping[Path, ResultFile], ids: list[str]) -> set[int]:
        """``--retry-failed``: forget the records of failed edits (in continual mode, of their whole blocks) so
        they are edited again; returns the blocks to redo."""
        failed = {cid for f in files.values() for cid, r in f.records.items() if "failed" in r}
        blocks = {b for b, unit in enumerate(self._units()) if any(ids[i] in failed for i in unit)}
        if self.opts.sequential:
            failed = {ids[i] for b in blocks for i in self._units()[b]}
        for f in files.values():
            f.drop(lambda r: str(r["case_id"]) not in failed)
        if failed:
            log.info("--retry-failed: %d case(s) are edited again", len(failed))
        return blocks if self.opts.sequential else set()

    def _forget_config_of_a_run_that_never_started(self) -> None:
        """A config.json with no result and no MMLU baseline beside it was written by a run that stopped before its
        first edit (a model that could not be loaded, a layer the model lacks): fixing the hparams and rerunning
        into the same --out must not be refused as another configuration, so that config.json is dropped."""
        path = self.out_dir / CONFIG
        if not path.is_file() or (self.out_dir / "mmlu_before.json").exists():
            return
        if any(read_results(p) or p.stat().st_size for p in result_files(self.out_dir)):
            return
        log.info("%s: no case was recorded under it (the last run stopped before its first edit); recording the "
                 "current configuration instead", path)
        path.unlink()

    # ---------------------------------------------------------------------------------------- model work
    def _ensure_model(self) -> None:
        if self.model is None:
            t0 = time.time()
            self.model, self.tok = self.editor.load_model(self.hp)
            _check_placement(self.model, self.ctx)
            log.info("loaded %s in %.1f s", self.hp_dict.get("model_name", "the model"), time.time() - t0)

    def _mmlu(self, model: Any) -> float:
        from .mmlu import mmlu_accuracy

        acc, _ = mmlu_accuracy(model, self.tok, self.mmlu_items, batch_size=self.opts.mmlu_batch_size)
        return 100.0 * acc

    def _mmlu_due(self, unit: int) -> bool:
        """MMLU after the edit of this case (single) or block (sequential): every ``mmlu_every``-th one, from the first."""
        return self.mmlu_enabled and unit % self.opts.mmlu_every == 0

    def _mmlu_before(self, compute: bool) -> float | None:
        """MMLU of the unedited model, computed once per output directory (kept in mmlu_before.json)."""
        if not self.mmlu_enabled:
            return None
        path = self.out_dir / "mmlu_before.json"
        if path.is_file():
            return json.loads(path.read_text(encoding="utf-8"))["MMLU_before"]
        if not compute:
            raise IncompleteRunError(f"{path} is missing; the main process computes it before its cases")
        self._ensure_model()
        value = self._mmlu(self.model)
        write_json_atomic(path, {"MMLU_before": value, "n": len(self.mmlu_items)})
        return value

    def _answers(self, model: Any, cases: Sequence[Mapping[str, Any]], results: Sequence[Any] = ()) -> list[list[str]]:
        """Greedy chat-template answers to every case's questions, batched across the cases (under the
        passages' system prompt when the edit results carry a context: the IN_CONTEXT reference)."""
        from hpse_easyedit import generate_answers

        from .references import answer_system

        questions = [self.task.questions(c) for c in cases]
        flat = generate_answers(
            model, self.tok, [q for qs in questions for q in qs],
            max_new_tokens=self.max_new_tokens, batch_size=self.opts.batch_size,
            system=answer_system(model, results, self.hp),
            template_kwargs=getattr(self.hp, "chat_template_kwargs", None),
        )
        out, pos = [], 0
        for qs in questions:
            out.append(list(flat[pos : pos + len(qs)]))
            pos += len(qs)
        return out

    def _record(self, index: int, case: Mapping[str, Any], answers: list[str], res: Any, seconds: float,
                block: int | None, mmlu_after: float | None) -> dict:
        rec = self._edit_record(index, case, res, seconds, block)
        rec.update(self._score(case, answers))
        if mmlu_after is not None:
            rec["MMLU_after"] = mmlu_after
        return rec

    def _edit_record(self, index: int, case: Mapping[str, Any], res: Any, seconds: float, block: int | None) -> dict:
        """What a case's record says about its edit (everything but the scores)."""
        rec: dict[str, Any] = {
            "case_id": case["case_id"],
            "index": index,
            "block": block,
            "subjects": [r["subject"] for r in case["requests"]],
            "edit_seconds": round(seconds, 3),
            "rounds": json_plain(list(getattr(res, "rounds", None) or [])),
        }
        if getattr(res, "algorithm_seconds", None) is not None:  # EasyEdit's own algorithm, the rest is integration
            rec["algorithm_seconds"] = round(res.algorithm_seconds, 3)
        rollouts = pack_rounds(getattr(res, "rollouts", None)) if self.opts.store_rollouts else None
        if rollouts is not None:
            rec["rollouts"] = rollouts
        return rec

    def _score(self, case: Mapping[str, Any], answers: list[str]) -> dict:
        """The case's scores; when the judge fails for good the answers are kept and Jnt/Dmp stored unjudged
        (a refused request, e.g. an unknown judge model, stops the run once this case is written)."""
        try:
            return self.task.score(case, answers, self.judge)
        except JudgeError as err:
            log.warning("case %s: the judge failed (%s); its answers are kept and judged by the next run",
                        case["case_id"], " ".join(str(err).split())[:200])
            if isinstance(err, JudgeRefusedError):
                self._judge_refused = err
            return self.task.unjudged_record(case, answers, self.judge, err)

    def _stop_if_judge_refused(self) -> None:
        err = getattr(self, "_judge_refused", None)
        if err is not None:
            raise err

    def _rejudge(self, ids: list[str]) -> None:
        """Judge again, from their stored answers, this process's recorded cases the judge could not judge before."""
        if self.judge is None or self.store is None:
            return
        index = {cid: i for i, cid in enumerate(ids)}
        pending = [r for cid, r in self.store.records.items() if cid in index and unjudged_metrics(r)]
        if not pending:
            return
        log.info("judging %d recorded case(s) again that the judge could not judge before (no new edit)", len(pending))
        redone = []
        for rec in pending:
            case = self.cases[index[str(rec["case_id"])]]
            scores = self._score(case, self.task.answers_of(rec))
            new = {k: v for k, v in rec.items() if k not in ("unjudged", "judge_error")}
            new.update(scores)
            redone.append(new)
        self.store.replace(redone)
        self._stop_if_judge_refused()
        left = sum(bool(unjudged_metrics(r)) for r in redone)
        log.info("%d of %d judged now%s", len(redone) - left, len(redone), f"; {left} still unjudged" if left else "")

    def _edit(self, model: Any, case: Mapping[str, Any]) -> tuple[Any, float]:
        t0 = time.time()
        try:
            res = self.editor.edit(model, self.tok, [dict(r) for r in case["requests"]], self.hp)
        except EditDivergedError as err:
            err.seconds = time.time() - t0
            raise
        return res, time.time() - t0

    def _failed_record(self, index: int, case: Mapping[str, Any], err: EditDivergedError, block: int | None) -> dict:
        """A case whose edit diverged: why, and no scores (left out of every mean, counted as failed)."""
        log.warning("case %s: %s", case["case_id"], err)
        return {"case_id": case["case_id"], "index": index, "block": block,
                "subjects": [r["subject"] for r in case["requests"]], "edit_seconds": round(err.seconds, 3),
                "rounds": [], "failed": str(err)}

    def _run_single(self, todo: list[int], progress: Any) -> None:
        for i in todo:
            case = self.cases[i]
            try:
                res, seconds = self._edit(self.model, case)
            except EditDivergedError as err:
                self.model = self.editor.restore(err.model, err.weights_copy)
                write_kept(self.store, [self._failed_record(i, case, err, None)])
                progress(1, None)
                continue
            answers = self._answers(res.model, [case], [res])[0]
            mmlu_after = self._mmlu(res.model) if self._mmlu_due(i) else None
            self.model = self.editor.restore(res.model, res.weights_copy)
            rec = self._record(i, case, answers, res, seconds, None, mmlu_after)
            write_kept(self.store, [rec])
            self._stop_if_judge_refused()
            progress(1, {m: f"{100 * rec[m]:.0f}" for m in self.task.metrics if rec.get(m) is not None})

    def _run_sequential(self, blocks: list[tuple[int, list[int]]], progress: Any) -> None:
        for b, block in blocks:
            model, weights0, edits, results = self._resume_block(b, block)  # results: IN_CONTEXT's passages
            self._checkpoint(b, block, len(edits), model, results)
            for j in range(len(edits), len(block)):
                model, weights0, edit, res = self._sequence_edit(model, weights0, b, j, block[j])
                results += [res] if res is not None else []
                edits.append(edit)
                write_kept(self.sequence.edits, [edit])
                if self.editor.resume is not None and len(block) > 1:
                    self.sequence.save_state(model, b, j + 1, weights0)
                self._checkpoint(b, block, j + 1, model, results)
            answers = self._answers(model, [self.cases[i] for i in block], results)
            mmlu_after = self._mmlu(model) if self._mmlu_due(b) else None
            self.model = self.editor.restore(model, weights0)
            records = []
            for i, a, edit in zip(block, answers, edits):
                rec = {k: v for k, v in edit.items() if k != "position"}
                if "failed" not in rec:
                    rec.update(self._score(self.cases[i], a))
                    if mmlu_after is not None:
                        rec["MMLU_after"] = mmlu_after
                records.append(rec)
            write_kept(self.store, records)
            self.sequence.finish(b)
            self._stop_if_judge_refused()
            progress(len(block), None)

    def _resume_block(self, b: int, block: list[int]) -> tuple[Any, Any, list[dict], list[Any]]:
        """The model as the recorded edits of block ``b`` left it, the values before its first edit, and
        those edits' records: loaded from the snapshot, or the edits replayed (each checked against its
        record; from the first that differs on, the block is redone)."""
        edits, results = self.sequence.recorded(b), []
        if not edits:
            return self.model, None, [], []
        model, weights0, done = self.model, None, 0
        state = self.sequence.load_state(b) if self.editor.resume is not None else None
        if state is not None and 0 < state["edits"] <= len(edits):
            model = self.editor.resume(self.model, self.hp, state["tensors"])
            weights0, done = state["weights0"], state["edits"]
            log.info("block %d: resuming after edit %d of %d from %s", b, done, len(block), self.sequence.state)
        if done < len(edits):
            log.info("block %d: replaying %d recorded edit(s) (%d to %d) without evaluating them", b,
                     len(edits) - done, done + 1, len(edits))
        for j in range(done, len(edits)):
            model, weights0, replayed, res = self._sequence_edit(model, weights0, b, j, block[j])
            results += [res] if res is not None else []
            if not same_edit(edits[j], replayed):
                log.warning("block %d: edit %d computes other values than recorded (another machine or kernels?); "
                            "its record and every later one of the block are redone", b, j + 1)
                self.sequence.forget_from(b, j)
                edits = [*edits[:j], replayed]
                write_kept(self.sequence.edits, [replayed])
                if self.editor.resume is not None:
                    self.sequence.save_state(model, b, j + 1, weights0)
                return model, weights0, edits, results
        return model, weights0, edits, results

    def _sequence_edit(self, model: Any, weights0: Any, b: int, j: int, i: int) -> tuple[Any, Any, dict, Any]:
        """Edit ``j`` of block ``b`` (case ``i``): the model after it, the values before the block's first edit,
        the edit's record and its result (None when it diverged: the model is then as before this edit)."""
        try:
            res, seconds = self._edit(model, self.cases[i])
        except EditDivergedError as err:
            return (err.model, err.weights_copy if weights0 is None else weights0,
                    {**self._failed_record(i, self.cases[i], err, b), "position": j}, None)
        weights0 = res.weights_copy if weights0 is None else weights0
        return res.model, weights0, {**self._edit_record(i, self.cases[i], res, seconds, b), "position": j}, res

    def _checkpoint(self, b: int, block: list[int], edits: int, model: Any, results: Sequence[Any]) -> None:
        """At a checkpoint, the scores of the block's first ``edits`` cases on the model as edited so far."""
        if edits not in (self.opts.checkpoints or ()) or edits >= len(block):
            return
        done = block[:edits]
        ids = [str(self.cases[i]["case_id"]) for i in done]
        if self.sequence.has_checkpoint(b, edits, ids):
            return
        failed = {str(r["case_id"]): r["failed"] for r in self.sequence.recorded(b) if "failed" in r}
        t0 = time.time()
        answers = self._answers(model, [self.cases[i] for i in done], results)
        mmlu_after = self._mmlu(model) if self.mmlu_enabled else None
        records = []
        for i, a in zip(done, answers):
            case = self.cases[i]
            rec: dict[str, Any] = {"case_id": case["case_id"], "index": i, "block": b, "checkpoint": edits,
                                   "subjects": [r["subject"] for r in case["requests"]]}
            if str(case["case_id"]) in failed:
                rec["failed"] = failed[str(case["case_id"])]
                records.append(rec)
                continue
            rec.update(self._score(case, a))
            if mmlu_after is not None:
                rec["MMLU_after"] = mmlu_after
            records.append(rec)
        write_kept(self.sequence.checkpoints, records)
        self._stop_if_judge_refused()
        log.info("block %d: checkpoint after %d edits evaluated in %.0f s", b, edits, time.time() - t0)

    # ---------------------------------------------------------------------------------------- driver
    def run(self) -> dict:
        """Run (or resume) this process's share; the main process holds the directory's writer lock throughout,
        so a second run into the same ``--out`` stops at once instead of editing every case again."""
        if not self.ctx.is_main:
            return self._run()
        check_writable("--out", self.out_dir)
        with writer_lock(self.out_dir, "--out"):
            try:
                return self._run()
            except KeyboardInterrupt:
                done = len(merge_results(self.out_dir, None, require_all=False)) if self.out_dir.is_dir() else 0
                raise Interrupted(f"{done} case(s) are recorded in {self.out_dir}; run the same command again to "
                                  "resume from there (a continual sequence resumes after its last edit)") from None

    def _run(self) -> dict:
        from tqdm.auto import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        ctx = self.ctx
        self._probe_judge()
        with ctx.main_first():  # the main process fills shared caches and repairs files; the others then read them
            self._data_paths = self._load_data()
            ids = [str(c) for c in self.cases["case_id"]]
            done = self._open_results(ids)
            self._rejudge(ids)
            mine = ctx.shard(list(enumerate(self._units())))
            todo = [(b, unit) for b, unit in mine if not all(ids[i] in done for i in unit)]
            if self.mmlu_enabled:
                self.mmlu_items = load_mmlu_subset(self.data_dir, self.opts.mmlu_n, shots=self.opts.mmlu_shots,
                                                   seed=self.opts.mmlu_seed)
            if todo or (ctx.is_main and self.mmlu_enabled and not (self.out_dir / "mmlu_before.json").is_file()):
                self._ensure_model()
        n_mine = sum(len(u) for _, u in mine)
        n_todo = sum(len(u) for _, u in todo)
        if ctx.world > 1:
            log.info("%s: %d of %d case(s) are this process's, %d to do, into %s", ctx.describe(), n_mine, len(ids),
                     n_todo, self.store.path.name)
        elif n_todo < len(ids):
            log.info("resuming %s: %d of %d case(s) already done", self.out_dir, len(ids) - n_todo, len(ids))
        mmlu_before = self._mmlu_before(compute=True) if ctx.is_main else None
        if n_todo:
            record = environment_record([ids[i] for _, unit in todo for i in unit], ctx)
            with open(self.out_dir / ENVIRONMENTS_FILE, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")
            desc = f"{self.task.name} {self.label}" + (f" [{ctx.rank}/{ctx.world}]" if ctx.world > 1 else "")
            with logging_redirect_tqdm(), tqdm(
                total=n_mine, initial=n_mine - n_todo, desc=desc, unit="case", dynamic_ncols=True, disable=not ctx.is_main,
            ) as bar:
                finished = [n_mine - n_todo]

                def progress(n: int, postfix: Mapping[str, str] | None) -> None:
                    finished[0] += n
                    bar.update(n)
                    if postfix:
                        bar.set_postfix(postfix)
                    if not ctx.is_main:  # only the main process draws a progress bar
                        log.info("%s: %d of %d case(s) done", ctx.describe(), finished[0], n_mine)

                if self.opts.sequential:
                    self._run_sequential(todo, progress)
                else:
                    self._run_single([u[0] for _, u in todo], progress)
        ctx.barrier()  # every process has written its last case; no results file changes from here on
        records = merge_results(self.out_dir, ids)
        if mmlu_before is None:
            mmlu_before = self._mmlu_before(compute=False)
        summary = self.summary(mmlu_before, [records[cid] for cid in ids])
        if ctx.is_main:
            write_json_atomic(self.out_dir / "summary.json", summary)
            rows = [(f"{self.label} after {c} edits", {self.task.name: part})
                     for c, part in summary.get("checkpoints", {}).items()]
            write_text_atomic(
                self.out_dir / "table.md",
                paper_table([*rows, (self.label, {self.task.name: summary})]) + judge_note([summary])
                + unjudged_note([summary]) + failed_note([summary]),
            )
            if summary.get("unke_metrics"):  # UnKE's own metrics: the same section `unke_metrics --write` adds
                from .unke_metrics import write_run

                write_run(self.out_dir, summary["unke_metrics"])
        return summary

    def close(self) -> None:
        """Release the judge endpoint and its cache."""
        if self.judge is not None:
            self.judge.close()
        elif self.client is not None:
            self.client.close()

    def summary(self, mmlu_before: float | None, all_records: list[dict]) -> dict:
        records = [r for r in all_records if "failed" not in r]  # failed edits have no scores
        out: dict[str, Any] = self.task.summarize(records)
        if len(records) < len(all_records):
            out["failed_cases"] = len(all_records) - len(records)
        if self.task.measures_mmlu:
            out["MMLU_before"] = mmlu_before
            out["MMLU_after"] = mean(r.get("MMLU_after") for r in records)
            out["MMLU_edits"] = sum(r.get("MMLU_after") is not None for r in records)  # < n_cases under --mmlu-every
        if self.task.needs_judge:
            out["judge"] = self.judge.name if self.judge else None
            out["unjudged_cases"] = sum(bool(unjudged_metrics(r)) for r in records)
        out.update(
            n_cases=len(all_records),
            stepin_rate_by_round=stepin_rate_by_round(records),
            edit_seconds_mean=mean(r["edit_seconds"] for r in all_records),
            **({"algorithm_seconds_mean": mean(r["algorithm_seconds"] for r in records)}
               if records and all("algorithm_seconds" in r for r in records) else {}),
            label=self.label,
            benchmark=self.task.name,
            editor=self.method,
            mode="sequential" if self.opts.sequential else "single",
            sequential=self.opts.sequential,
            **({"checkpoints": self._checkpoint_summaries(all_records)} if self.opts.checkpoints else {}),
            out_dir=str(self.out_dir),
            hparams=self._recorded_hparams(),
        )
        return out

    def _checkpoint_summaries(self, records: list[dict]) -> dict:
        """Per checkpoint (edits made in each sequence), the task's summary of the cases evaluated there."""
        blocks = {r.get("block") for r in records}
        out = {}
        for c, recs in sorted(checkpoint_records(self.out_dir).items()):
            recs = [r for r in recs.values() if r.get("block") in blocks]
            failed = sum("failed" in r for r in recs)
            recs = [r for r in recs if "failed" not in r]
            summary: dict[str, Any] = self.task.summarize(recs)
            if failed:
                summary["failed_cases"] = failed
            if self.task.measures_mmlu:
                summary["MMLU_after"] = mean(r.get("MMLU_after") for r in recs)
            summary["n_cases"] = len(recs)
            out[str(c)] = summary
        return out

    def _recorded_hparams(self) -> dict:
        """The hparams as config.json recorded them when the run started: a resume or a re-summary on another
        device (``--set device=...``, which config.json ignores) never rewrites where the run was recorded to run."""
        path = self.out_dir / CONFIG
        if path.is_file():
            return json.loads(path.read_text(encoding="utf-8")).get("hparams", self.hp_dict)
        return self.hp_dict



ENVIRONMENTS_FILE = "environments.jsonl"
_RECORDED_PACKAGES = ("torch", "transformers", "peft", "accelerate", "tokenizers")


def environment_record(case_ids: Sequence[str], ctx: ProcessContext) -> dict:
    """What produced the cases one invocation edits: package versions, the EasyEdit checkout, the machine.

    A run that resumes in another environment (a newer transformers, another EasyEdit commit) keeps one
    such line per invocation in ``environments.jsonl``, so every record can be traced to the versions that
    made it; none of this is part of ``config.json``, which a resume must match.
    """
    import os
    import platform
    import subprocess
    from datetime import datetime, timezone
    from importlib import metadata

    versions = {}
    for name in _RECORDED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    easyedit = None
    src = os.environ.get("EASYEDIT_SRC")
    if src:
        try:
            commit = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True,
                                    timeout=10).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            commit = None
        easyedit = {"src": src, "commit": commit}
    return {
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "rank": ctx.rank, "world": ctx.world, "cases": list(case_ids),
        "python": platform.python_version(), **versions, "easyedit": easyedit,
        "platform": platform.platform(), "cpus": os.cpu_count(),
    }


def run_benchmark(opts: RunOptions, context: ProcessContext | None = None) -> dict:
    """Run (or resume) one benchmark for one hparams file; returns the summary written to summary.json.

    Under a multi-process launch every process calls this with the same options, runs its share and
    returns the same summary; only the main process writes it. ``context`` defaults to this process's
    (``benchmarks.distributed.process_context``); passing one runs that shard of an N-process layout
    without a process group (its barriers do nothing), e.g. to drive shards one after another.
    """
    run = _Run(opts, context)
    try:
        return run.run()
    finally:
        run.close()


def write_kept(file: ResultFile, records: list[dict]) -> None:
    """Append finished records; on a full disk they are kept in memory and written as soon as space is freed
    (tried every 10 s for ``$HPSE_DISK_FULL_WAIT`` seconds, default 600), then saved whole to a temporary file the
    one-line error names, so no finished case is lost."""
    wait, waited = float(os.environ.get("HPSE_DISK_FULL_WAIT", 600)), 0.0
    while True:
        try:
            file.append(records)
            return
        except OSError as err:
            if err.errno not in ENVIRONMENT_ERRNOS:
                raise
            if waited >= wait or err.errno not in (errno.ENOSPC, errno.EDQUOT):  # no space to wait for
                kept = _save_elsewhere(records, file.path.name)
                where = f"saved whole to {kept}: append it with `cat {kept} >> {file.path}`" if kept else "lost"
                raise UsageError(f"{file.path}: {err.strerror or err}; the {len(records)} finished record(s) were "
                                 f"{where} once space is freed, then run the same command again to go on") from None
            if not waited:
                log.warning("%s: %s; the %d finished record(s) are kept in memory and written as soon as space is "
                            "freed (trying every 10 s for %.0f s)", file.path, err.strerror, len(records), wait)
            step = min(10.0, wait - waited)
            time.sleep(step)
            waited += step


def _save_elsewhere(records: list[dict], name: str) -> str | None:
    import tempfile

    payload = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    for root in (tempfile.gettempdir(), "/dev/shm"):
        try:
            fd, path = tempfile.mkstemp(prefix=f"hpse-unwritten-{name}-", suffix=".jsonl", dir=root)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(payload)
            return path
        except OSError:
            continue
    return None


def failed_note(summaries: Sequence[Mapping]) -> str:
    """A line under a table saying how many cases' edits diverged (left out of the means, not counted as 0)."""
    n = sum(int(s.get("failed_cases") or 0) for s in summaries if s)
    if not n:
        return ""
    total = sum(int(s.get("n_cases") or 0) for s in summaries if s)
    return (f"\nFAILED: the edits of {n} of {total} case(s) diverged (results.jsonl says why); they are left out of "
            "every mean, not counted as 0. Lower lr and rerun with --retry-failed to edit them again.\n")


def unjudged_note(summaries: Sequence[Mapping]) -> str:
    """A line under a table saying how many cases the judge could not judge (stored unjudged, not as 0)."""
    n = sum(int(s.get("unjudged_cases") or 0) for s in summaries if s)
    if not n:
        return ""
    total = sum(int(s.get("n_cases") or 0) for s in summaries if s and "unjudged_cases" in s)
    return (f"\nUNJUDGED: {n} of {total} UnKEBench case(s) have no Jnt/Dmp yet (the judge could not judge them; they "
            "are left out of Jnt/Dmp, not counted as 0). Rerun the same command to judge them; nothing is edited again.\n")
