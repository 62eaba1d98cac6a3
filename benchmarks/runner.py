"""Run an editing method over UnKEBench or MQuAKE-uns, resumably, and summarise it in the paper's layout.

Single editing: every case is edited into the unedited model, evaluated, and the edit is undone.
Continual editing (``sequential=T``): T consecutive cases are edited one after another into the same
model, then all T are evaluated, then the model is restored; the next T start from the unedited model.

Each finished case (in continual mode, each finished block of T) is appended to ``results.jsonl`` at
once, so a killed run loses only the work in flight, and rerunning with the same output directory
resumes. ``summary.json`` and ``table.md`` are rewritten from all records at the end.

Under ``accelerate launch --num_processes N`` (see ``benchmarks.distributed`` and docs/SCALE_OUT.md)
process R runs every N-th case (every N-th block of T in continual mode) starting at R, into its own
``results.rankR-of-N.jsonl``; after ``wait_for_everyone`` the results files are merged, and the main
process writes ``summary.json`` and ``table.md`` only if every case is there exactly once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import re
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Mapping, Sequence

from .datasets import (
    EDIT_PROMPT,
    MQUAKE_FILE,
    UNKE_FILE,
    UNKE_SUBJECTS_FILE,
    default_cache_dir,
    default_data_dir,
    file_sha256,
    load_mmlu_subset,
    load_mquake_uns,
    load_unkebench,
)
from hpse_easyedit.cli import DEBUG_FLAG, DEBUG_HELP, OneLineParser, UsageError, check_new_dir, run_cli, user_error_types

from .distributed import DEFAULT_TIMEOUT, LaunchError, ProcessContext, current_context, process_context
from .editors import Editor, editor_for_hparams_file
from .judge import LEXICAL_JUDGE_NAME, ChatClient, Judge, JudgeError, JudgeRefusedError, JudgeSettings, LLMJudge, make_judge
from .metrics import mean
from .paths import JUDGE_CACHE
from .report import judge_note, paper_table
from .rollouts import pack_rounds
from .store import (
    CONFIG,
    ConfigPolicy,
    IncompleteRunError,
    ResultFile,
    check_run_config,
    merge_results,
    read_results,
    result_files,
    results_name,
    write_json_atomic,
)
from .tasks import TASKS, Task, unjudged_metrics

__all__ = [
    "PLACEMENT_KEYS", "RunOptions", "add_run_arguments", "cli_main", "config_policy",
    "configure_logging", "default_out_dir", "is_main_process", "options_from_args", "run_benchmark",
    "stepin_rate_by_round", "unjudged_note", "user_errors",
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

    def __post_init__(self) -> None:
        """Every option range is checked here, before any file is read or model loaded (``UsageError``)."""
        if self.benchmark not in TASKS:
            raise UsageError(f"benchmark must be one of {sorted(TASKS)}, got {self.benchmark!r}")
        at_least = [
            ("--sequential", self.sequential, 1, "cases edited one after another"),
            ("--limit", self.limit, 1, "the first N cases"),
            ("--batch-size", self.batch_size, 1, "answers generated at once"),
            ("--max-new-tokens", self.max_new_tokens, 1, "answer length cap"),
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
        if self.subjects not in ("auto", "file", "llm", "heuristic"):
            raise UsageError(f"--subjects must be auto, file, llm or heuristic, got {self.subjects!r}")
        if self.judge not in ("auto", "llm", "lexical"):
            raise UsageError(f"--judge must be auto, llm or lexical, got {self.judge!r}")
        check_new_dir("--out", self.out_dir, may_hold_files=True)
        check_new_dir("--cache-dir", self.cache_dir, may_hold_files=True)


def stepin_rate_by_round(records: Sequence[Mapping[str, Any]]) -> list[float | None]:
    """Mean step-in rate per round index over the records (rounds without a rollout are left out)."""
    n_rounds = max((len(r.get("rounds") or []) for r in records), default=0)
    return [
        mean((r.get("rounds") or [])[i].get("stepin_rate") for r in records if len(r.get("rounds") or []) > i)
        for i in range(n_rounds)
    ]


def _plain(value: Any) -> Any:
    """JSON-able copy of engine diagnostics (tensors and numpy scalars become Python numbers)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _computing(overrides: Sequence[str]) -> list[str]:
    """The overrides that change what a run computes: placement overrides (``device=...``) say only where it runs."""
    return [o for o in overrides if o.split("=", 1)[0].strip() not in PLACEMENT_KEYS]


def default_out_dir(benchmark: str, hparams: str, overrides: Sequence[str]) -> Path:
    """``runs/<benchmark>/<hparams name>[+key=value...]``: distinct overrides get distinct directories
    (placement overrides such as ``device=cuda`` do not: moving a run to another device resumes it)."""
    name = Path(hparams).stem + "".join(f"+{o}" for o in _computing(overrides))
    return Path("runs") / benchmark / re.sub(r"[^\w.+=-]+", "_", name)


#: hparams keys that say where a run executes, not what it computes: a rerun may change them freely
#: (move a half-done run to other GPUs, or under accelerate launch, where each process sets its own device).
PLACEMENT_KEYS = ("device", "model_parallel")


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
                value = json.loads(json.dumps(_plain(default)))
            except (TypeError, ValueError):  # not a JSON value, so never in a recorded config either
                continue
            if f.name in out and out[f.name] != value:
                clash.add(f.name)
            out[f.name] = value

    walk(obj)
    return {k: v for k, v in out.items() if k not in clash}


def config_policy(hparams: Any) -> ConfigPolicy:
    """What a rerun may differ in from a run directory's ``config.json`` without being another configuration.

    Placement keys of the hparams (``PLACEMENT_KEYS``) are ignored; a key directly under ``hparams``
    that the recorded config does not have is accepted when its value is the default of that field in
    the code (a field added to the hparams after the run started, at the behaviour the old code had).
    Anything else that differs, nested keys included, is a different configuration.
    """
    defaults = _field_defaults(hparams)
    return ConfigPolicy(
        ignored=lambda path: len(path) == 2 and path[0] == "hparams" and path[1] in PLACEMENT_KEYS,
        new_default=lambda path, value: (
            len(path) == 2 and path[0] == "hparams" and path[1] in defaults and defaults[path[1]] == value
        ),
    )


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
        self.hp_dict = _plain(self.editor.hparams_dict(requested))
        self.ctx = context or process_context(
            model_parallel=bool(self.hp_dict.get("model_parallel")), timeout=timedelta(hours=opts.dist_timeout_hours),
        )
        # The recorded hparams (config.json, summary.json) are the requested ones; each process of a
        # multi-process launch runs them on the device accelerate gave it.
        self.hp = requested if self.ctx.device is None else self.editor.load_hparams(
            opts.hparams, [*opts.overrides, f"device={self.ctx.device}"])
        self.policy = config_policy(requested)
        self.label = opts.label or Path(opts.hparams).stem + "".join(f" {o}" for o in _computing(opts.overrides))
        self.max_new_tokens = opts.max_new_tokens or self.task.default_max_new_tokens
        settings = JudgeSettings(**{**opts.judge_settings.__dict__, "cache_path": str(self.cache_dir / JUDGE_CACHE)})
        self.judge: Judge | None = make_judge(opts.judge, settings, warn=False) if self.task.needs_judge else None
        self.client: ChatClient | None = self.judge.client if isinstance(self.judge, LLMJudge) else None
        if self.client is None and not self.task.needs_judge and opts.judge != "lexical" and settings.resolve().configured:
            self.client = ChatClient(settings)  # generates passages for MQuAKE files that have none
        self.out_dir = Path(opts.out_dir) if opts.out_dir else default_out_dir(opts.benchmark, opts.hparams, opts.overrides)
        self.mmlu_enabled = self.task.name == "unkebench" and opts.mmlu_n > 0
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
        default = UNKE_FILE if self.task.name == "unkebench" else MQUAKE_FILE
        option = "--unke-file" if self.task.name == "unkebench" else "--mquake-file"
        path = Path(o.data_file or default)
        path = path if path.is_absolute() else self.data_dir / path
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
        if self.task.name == "unkebench":
            file = o.data_file or UNKE_FILE
            subjects_file = Path(o.subjects_file) if o.subjects_file else self.data_dir / UNKE_SUBJECTS_FILE
            self.cases = load_unkebench(
                self.data_dir, file=file, limit=o.limit, subjects=o.subjects, subjects_file=subjects_file,
                client=self.client, cache_dir=self.cache_dir, prompt_template=template,
            )
            paths = [self.data_dir / file if not Path(file).is_absolute() else Path(file)]
            if subjects_file.is_file() and o.subjects in {"auto", "file"}:
                paths.append(subjects_file)
        else:
            file = o.data_file or MQUAKE_FILE
            self.cases = load_mquake_uns(self.data_dir, file=file, limit=o.limit, client=self.client, cache_dir=self.cache_dir,
                                         prompt_template=template)
            paths = [self.data_dir / file if not Path(file).is_absolute() else Path(file)]
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
        if self.task.name == "unkebench":
            config["judge"] = self.judge.name if self.judge else None
            config["subjects"] = o.subjects
            config["mmlu"] = {"n": o.mmlu_n, "shots": o.mmlu_shots, "seed": o.mmlu_seed} if self.mmlu_enabled else None
            if self.mmlu_enabled and o.mmlu_every != 1:  # absent at 1, so run directories from before the option still match
                config["mmlu"]["every"] = o.mmlu_every
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
        if main:
            files = {p: ResultFile(p) for p in result_files(self.out_dir)}
            merge_results(self.out_dir, ids, require_all=False)  # refuses a case recorded twice
            if self.opts.sequential:
                done = {cid for f in files.values() for cid in f.records}
                selected = set(ids)
                whole = {ids[i] for blk in self._units() if all(ids[j] in done for j in blk) for i in blk}
                dropped = [cid for f in files.values()
                           for cid in f.drop(lambda r: str(r["case_id"]) in whole or str(r["case_id"]) not in selected)]
                if dropped:
                    log.warning("dropping %d record(s) of an unfinished block; the block is redone", len(dropped))
        self.store = ResultFile(own)
        # Files of this launch's other processes hold only their cases, and are being written to.
        peers = {results_name(r, self.ctx.world) for r in range(self.ctx.world)} - {own.name}
        done = set(self.store.records)
        for path in result_files(self.out_dir):
            if path.name not in peers and path != own:
                done |= set(read_results(path))
        return done

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
        rec: dict[str, Any] = {
            "case_id": case["case_id"],
            "index": index,
            "block": block,
            "subjects": [r["subject"] for r in case["requests"]],
            "edit_seconds": round(seconds, 3),
            "rounds": _plain(list(getattr(res, "rounds", None) or [])),
        }
        rollouts = pack_rounds(getattr(res, "rollouts", None)) if self.opts.store_rollouts else None
        if rollouts is not None:
            rec["rollouts"] = rollouts
        rec.update(self._score(case, answers))
        if mmlu_after is not None:
            rec["MMLU_after"] = mmlu_after
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
        res = self.editor.edit(model, self.tok, [dict(r) for r in case["requests"]], self.hp)
        return res, time.time() - t0

    def _run_single(self, todo: list[int], progress: Any) -> None:
        for i in todo:
            case = self.cases[i]
            res, seconds = self._edit(self.model, case)
            answers = self._answers(res.model, [case], [res])[0]
            mmlu_after = self._mmlu(res.model) if self._mmlu_due(i) else None
            self.model = self.editor.restore(res.model, res.weights_copy)
            rec = self._record(i, case, answers, res, seconds, None, mmlu_after)
            self.store.append([rec])
            self._stop_if_judge_refused()
            progress(1, {m: f"{100 * rec[m]:.0f}" for m in self.task.metrics if rec.get(m) is not None})

    def _run_sequential(self, blocks: list[tuple[int, list[int]]], progress: Any) -> None:
        for b, block in blocks:
            model, first, results = self.model, None, []
            for i in block:
                res, seconds = self._edit(model, self.cases[i])
                first = res if first is None else first
                model = res.model
                results.append((res, seconds))
            answers = self._answers(model, [self.cases[i] for i in block], [res for res, _ in results])
            mmlu_after = self._mmlu(model) if self._mmlu_due(b) else None
            self.model = self.editor.restore(model, first.weights_copy)
            self.store.append([
                self._record(i, self.cases[i], a, res, seconds, b, mmlu_after)
                for i, a, (res, seconds) in zip(block, answers, results)
            ])
            self._stop_if_judge_refused()
            progress(len(block), None)

    # ---------------------------------------------------------------------------------------- driver
    def run(self) -> dict:
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
            (self.out_dir / "table.md").write_text(
                paper_table([(self.label, {self.task.name: summary})]) + judge_note([summary]) + unjudged_note([summary]),
                encoding="utf-8",
            )
        return summary

    def close(self) -> None:
        """Release the judge endpoint and its cache."""
        if self.judge is not None:
            self.judge.close()
        elif self.client is not None:
            self.client.close()

    def summary(self, mmlu_before: float | None, records: list[dict]) -> dict:
        out: dict[str, Any] = self.task.summarize(records)
        if self.task.name == "unkebench":
            out["MMLU_before"] = mmlu_before
            out["MMLU_after"] = mean(r.get("MMLU_after") for r in records)
            out["MMLU_edits"] = sum(r.get("MMLU_after") is not None for r in records)  # < n_cases under --mmlu-every
            out["judge"] = self.judge.name if self.judge else None
            out["unjudged_cases"] = sum(bool(unjudged_metrics(r)) for r in records)
        out.update(
            n_cases=len(records),
            stepin_rate_by_round=stepin_rate_by_round(records),
            edit_seconds_mean=mean(r["edit_seconds"] for r in records),
            label=self.label,
            benchmark=self.task.name,
            editor=self.editor.name,
            mode="sequential" if self.opts.sequential else "single",
            sequential=self.opts.sequential,
            out_dir=str(self.out_dir),
            hparams=self._recorded_hparams(),
        )
        return out

    def _recorded_hparams(self) -> dict:
        """The hparams as config.json recorded them when the run started: a resume or a re-summary on another
        device (``--set device=...``, which config.json ignores) never rewrites where the run was recorded to run."""
        path = self.out_dir / CONFIG
        if path.is_file():
            return json.loads(path.read_text(encoding="utf-8")).get("hparams", self.hp_dict)
        return self.hp_dict



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


# -------------------------------------------------------------------------------------------- CLI glue
def add_run_arguments(parser: argparse.ArgumentParser, benchmark: str | None) -> None:
    """The options shared by run_hpse_mquake.py, run_hpse_unkebench.py and run_compare.py."""
    g = parser.add_argument_group("data and run")
    g.add_argument("--data", metavar="DIR", help="data directory (default: $HPSE_DATA_DIR or ../shared/data)")
    g.add_argument("--limit", type=int, metavar="N", help="first N cases only (a rerun may raise it and resume)")
    g.add_argument("--cases", type=lambda v: v.split(","), metavar="ID,ID,...",
                   help="only the cases with these case_id values, in data order (with --limit: among the first N); "
                        "a later run into the same --out may pick others or more; not with --sequential")
    g.add_argument("--sequential", type=int, metavar="T", help="continual editing: T cases edited one after another, then evaluated")
    g.add_argument("--batch-size", type=int, default=8, help="generation batch size (default 8)")
    g.add_argument("--max-new-tokens", type=int, help="answer length cap (default 200 UnKEBench, 128 MQuAKE-uns)")
    g.add_argument("--cache-dir", metavar="DIR", help="judge answers and generated data (default: $HPSE_CACHE_DIR or ~/.cache/hpse_easyedit)")
    g.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"], type=str.upper,
                   help="logging level (default INFO)")
    g.add_argument(DEBUG_FLAG, action="store_true", help=DEBUG_HELP)
    g.add_argument("--dist-timeout-hours", type=float, default=DEFAULT_TIMEOUT.total_seconds() / 3600, metavar="H",
                   help="under accelerate launch: how long a process that finished its cases waits for the others "
                        f"(default {DEFAULT_TIMEOUT.total_seconds() / 3600:.0f})")
    g.add_argument("--no-rollouts", action="store_true",
                   help="do not keep each round's rollout (token ids, step-in mask) in results.jsonl")
    if benchmark in (None, "unkebench"):
        u = parser.add_argument_group("UnKEBench")
        u.add_argument("--unke-file", metavar="FILE", help=f"UnKEBench file, relative to --data (default {UNKE_FILE}; v3 works too)")
        u.add_argument("--subjects", default="auto", choices=["auto", "file", "llm", "heuristic"],
                       help="subject phrases for 'Introduce {s}.': file, generated by the judge model, or heuristic; "
                            "auto = file, then judge model, then a logged heuristic fallback")
        u.add_argument("--subjects-file", metavar="FILE", help=f"id -> subject JSON (default --data/{UNKE_SUBJECTS_FILE})")
        u.add_argument("--mmlu-n", type=int, default=100, help="MMLU subset size for locality (0 skips it; default 100)")
        u.add_argument("--mmlu-shots", type=int, default=5, help="dev examples per MMLU prompt (default 5)")
        u.add_argument("--mmlu-seed", type=int, default=0, help="seed of the fixed MMLU subset (default 0)")
        u.add_argument("--mmlu-every", type=int, default=1, metavar="K",
                       help="MMLU after every K-th edit only (cases or blocks 0, K, 2K, ...; default 1 = every edit): "
                            "on a CPU the 5-shot subset costs more than the edit")
    if benchmark in (None, "mquake-uns"):
        m = parser.add_argument_group("MQuAKE-uns")
        m.add_argument("--mquake-file", metavar="FILE",
                       help=f"MQuAKE file, relative to --data (default {MQUAKE_FILE}; CF-3k/Remastered files get generated passages)")
    j = parser.add_argument_group("judge (OpenAI-compatible endpoint)")
    j.add_argument("--judge", default="auto", choices=["auto", "llm", "lexical"],
                   help="llm = the endpoint below; lexical = offline fallback; auto = llm when an endpoint is configured")
    j.add_argument("--judge-base-url", metavar="URL", help="default: $HPSE_JUDGE_BASE_URL or $OPENAI_BASE_URL")
    j.add_argument("--judge-model", metavar="NAME", help="default: $HPSE_JUDGE_MODEL or gemini-2.5-flash")
    j.add_argument("--judge-api-key", metavar="KEY",
                   help="prefer the environment: $HPSE_JUDGE_API_KEY or $OPENAI_API_KEY (a key on the command line is visible to other users)")
    j.add_argument("--judge-timeout", type=float, default=120.0, help="seconds per judge request (default 120)")
    j.add_argument("--judge-max-attempts", type=int, default=6, help="most requests per judge question: the openai client's own retries of timeouts/429/5xx and our re-asks of unparsable answers together (default 6)")


def options_from_args(args: argparse.Namespace, benchmark: str, hparams: str, overrides: Sequence[str],
                      out_dir: str | None, label: str | None = None) -> RunOptions:
    """RunOptions for one benchmark from parsed command-line arguments."""
    return RunOptions(
        benchmark=benchmark,
        hparams=hparams,
        overrides=list(overrides),
        data_dir=args.data,
        out_dir=out_dir,
        label=label,
        limit=args.limit,
        cases=args.cases,
        sequential=args.sequential,
        batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens,
        data_file=getattr(args, "unke_file" if benchmark == "unkebench" else "mquake_file", None),
        subjects=getattr(args, "subjects", "auto"),
        subjects_file=getattr(args, "subjects_file", None),
        judge=args.judge,
        judge_settings=JudgeSettings(
            base_url=args.judge_base_url, model=args.judge_model, api_key=args.judge_api_key,
            timeout=args.judge_timeout, max_attempts=args.judge_max_attempts,
        ),
        cache_dir=args.cache_dir,
        mmlu_n=getattr(args, "mmlu_n", 0),
        mmlu_shots=getattr(args, "mmlu_shots", 5),
        mmlu_seed=getattr(args, "mmlu_seed", 0),
        mmlu_every=getattr(args, "mmlu_every", 1),
        dist_timeout_hours=args.dist_timeout_hours,
        store_rollouts=not args.no_rollouts,
    )


def configure_logging(level: str) -> None:
    """Log to stderr at ``level``; under a multi-process launch every line names its process."""
    rank, world = os.environ.get("RANK", "0"), os.environ.get("WORLD_SIZE", "1")
    who = f"[{rank}/{world}] " if world.isdigit() and int(world) > 1 else ""
    logging.basicConfig(level=getattr(logging, str(level).upper(), logging.INFO),
                        format=f"%(asctime)s %(levelname)s {who}%(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "openai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def benchmark_errors() -> tuple[type[BaseException], ...]:
    """The benchmarks' own exceptions that mean bad input or a bad environment, not a bug."""
    from .datasets import DataError
    from .judge import JudgeError
    from .store import ConfigMismatchError

    return (DataError, JudgeError, ConfigMismatchError, IncompleteRunError, LaunchError)


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean bad input (shown as one line by the scripts), not a bug (shown with a traceback)."""
    return user_error_types(benchmark_errors())


def unjudged_note(summaries: Sequence[Mapping]) -> str:
    """A line under a table saying how many cases the judge could not judge (stored unjudged, not as 0)."""
    n = sum(int(s.get("unjudged_cases") or 0) for s in summaries if s)
    if not n:
        return ""
    total = sum(int(s.get("n_cases") or 0) for s in summaries if s and "unjudged_cases" in s)
    return (f"\nUNJUDGED: {n} of {total} UnKEBench case(s) have no Jnt/Dmp yet (the judge could not judge them; they "
            "are left out of Jnt/Dmp, not counted as 0). Rerun the same command to judge them; nothing is edited again.\n")


def _cli(benchmark: str, argv: Sequence[str]) -> int:
    title = {"unkebench": "UnKEBench", "mquake-uns": "MQuAKE-uns"}[benchmark]
    parser = OneLineParser(
        description=f"Edit with the method of an hparams file over {title} and score it as the HPSE paper does. "
                    "Rerunning with the same --out resumes. Exit code 0: done; 1: done, but some cases are still "
                    "unjudged (rerun to judge them); 2: a bad input, reported in one line before any edit.",
    )
    parser.add_argument("--hparams", required=True, metavar="FILE", help="YAML hparams file; its alg_name picks the editor")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override an hparams field, repeatable (e.g. --set kl_weight=0 for the plain LoRA baseline)")
    parser.add_argument("--out", metavar="DIR", help=f"output directory (default runs/{benchmark}/<hparams name>[+overrides])")
    parser.add_argument("--label", help="row label in the table (default: hparams name + overrides)")
    add_run_arguments(parser, benchmark)
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    summary = run_benchmark(options_from_args(args, benchmark, args.hparams, args.set, args.out, args.label))
    if is_main_process():
        print(paper_table([(summary["label"], {benchmark: summary})]) + judge_note([summary]) + unjudged_note([summary]),
              end="")
        print(f"\n{summary['n_cases']} case(s); summary: {Path(summary['out_dir']) / 'summary.json'}")
    return 1 if summary.get("unjudged_cases") else 0


def cli_main(benchmark: str, argv: Sequence[str] | None = None) -> int:
    """Command line of run_hpse_mquake.py / run_hpse_unkebench.py: run, then print the paper-layout table.

    A bad input is one logged line and exit code 2 (``--debug``: the traceback); see ``hpse_easyedit.cli.run_cli``.
    """
    return run_cli(lambda args: _cli(benchmark, args), argv, extra=benchmark_errors(), logger=log)


def is_main_process() -> bool:
    """True unless this is a non-main process of a multi-process launch (which must not print or write shared files)."""
    ctx = current_context()
    return ctx is None or ctx.is_main
