"""Run an editing method over a benchmark task, resumably, and summarise it in the paper's layout.

``run_benchmark`` resolves the options into four stages, each with one job: the run directory
(``benchmarks.run.run_dir``: config.json, resume, results files, lock), the case loop
(``benchmarks.run.case_loop``: edit, answer, restore; single or continual editing), the scorer
(``benchmarks.run.scorer``: the task's scores, the judge, rejudging) and the summary
(``benchmarks.run.summary``: summary.json, table.md).

Each finished case (in continual mode, each finished block of T) is appended to ``results.jsonl`` at
once, so a killed run loses only the work in flight, and rerunning with the same output directory
resumes. ``summary.json`` and ``table.md`` are rewritten from all records at the end.

Under ``accelerate launch --num_processes N`` (see ``benchmarks.run.distributed`` and
docs/SCALE_OUT.md) process R runs every N-th case (every N-th block of T in continual mode) starting
at R, into its own ``results.rankR-of-N.jsonl``; after ``wait_for_everyone`` the results files are
merged, and the main process writes ``summary.json`` and ``table.md`` only if every case is there
exactly once.

What differs between benchmarks (data file and loader, options, generation limit, judge, MMLU) is
the ``Task``'s (``benchmarks.tasks``); what a rerun may change is ``store.config_policy``; the
command line is ``benchmarks.run.cli``, which imports this module (never the reverse).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from hpse_easyedit.errors import UsageError

from ..records.store import KERNEL_KEYS, PLACEMENT_KEYS, config_policy, json_plain, merge_results
from ..tasks.datasets import EDIT_PROMPT, file_sha256
from ..tasks.metrics import stepin_rate_by_round
from ..tasks.paths import default_cache_dir, default_data_dir
from ..tasks.task import TASKS, data_path
from .case_loop import Editing, Progress, SequentialLoop, SingleLoop
from .distributed import ProcessContext, process_context
from .methods import MethodSpec, method_for_file, method_label
from .options import RunOptions
from .run_dir import RunDirectory, units
from .scorer import Scorer
from .summary import RunSummary, failed_note, unjudged_note

__all__ = [
    "CPU_CASES_AT_ONCE",
    "PLACEMENT_KEYS",
    "RunOptions",
    "auto_cases_at_once",
    "config_policy",
    "default_out_dir",
    "failed_note",
    "run_benchmark",
    "stepin_rate_by_round",
    "unjudged_note",
]

log = logging.getLogger(__name__)


def _computing(overrides: Sequence[str]) -> list[str]:
    """The overrides that change what a run computes: placement overrides (``device=...``) say only
    where it runs, kernel overrides (``fast_decode=...``) only which kernels compute it."""
    return [o for o in overrides if o.split("=", 1)[0].strip() not in PLACEMENT_KEYS + KERNEL_KEYS]


def default_out_dir(benchmark: str, hparams: str, overrides: Sequence[str]) -> Path:
    """``runs/<benchmark>/<hparams name>[+key=value...]``: distinct overrides get distinct
    directories (placement overrides such as ``device=cuda`` do not: moving a run to another device
    resumes it)."""
    name = Path(hparams).stem + "".join(f"+{o}" for o in _computing(overrides))
    return Path("runs") / benchmark / re.sub(r"[^\w.+=-]+", "_", name)


def _check_data_paths(opts: RunOptions, data_dir: Path) -> None:
    """The data directory and the files the options name exist (before anything is loaded)."""
    if not data_dir.is_dir():
        raise UsageError(
            f"--data {data_dir}: no such directory; point --data (or $HPSE_DATA_DIR) at the "
            "benchmark data (README, section Data)"
        )
    task = TASKS[opts.benchmark]
    path = data_path(data_dir, opts.data_file or task.data_file)
    if not path.is_file():
        option = task.data_option.flag
        raise UsageError(
            f"{option} {path}: no such file; check --data and {option} (README, section Data)"
        )
    for o in task.options:
        value = opts.task_options[o.name]
        if o.must_exist and value and not Path(value).is_file():
            raise UsageError(f"{o.flag} {value}: no such file; {o.must_exist}")


class _Run:
    """One benchmark run's options resolved: its task, method, hparams, process, directory and
    stages."""

    def __init__(self, opts: RunOptions, context: ProcessContext | None = None) -> None:
        self.opts = opts
        self.task = TASKS[opts.benchmark]
        self.data_dir = Path(opts.data_dir) if opts.data_dir else default_data_dir()
        cache_dir = Path(opts.cache_dir) if opts.cache_dir else default_cache_dir()
        _check_data_paths(opts, self.data_dir)
        self.method = method_for_file(opts.hparams)
        requested, self.hp_dict, hp, self.ctx = _hparams(self.method, opts, context)
        if opts.cases_at_once == "auto":  # a copy: the caller's options may serve other methods
            self.opts = opts = opts.model_copy(
                update={"cases_at_once": auto_cases_at_once(opts, self.method, hp)}
            )
        for flag, value in (
            ("--cases-at-once", opts.cases_at_once),
            ("--sequences-at-once", opts.sequences_at_once),
        ):
            if value > 1 and (self.method.edit_cases is None or self.method.resume is None):
                raise UsageError(
                    f"{flag} {value}: {self.method.name} edits one case at a time; drop {flag} "
                    "(HPSE files, plain LoRA and FT-M among them, take it)"
                )
        method = method_label(self.method.name, self.hp_dict)
        self.scorer = Scorer(self.task, opts.judge, opts.judge_settings, cache_dir)
        self.cache_dir = cache_dir
        out_dir = _out_dir(opts)
        self.directory = RunDirectory(out_dir, self.ctx, config_policy(requested))
        self.probe = self.task.locality_probe(opts.task_options, self.data_dir, out_dir)
        self.editing = Editing(
            self.method,
            hp,
            self.hp_dict.get("model_name", "the model"),
            self.task,
            max_new_tokens=opts.max_new_tokens or self.task.default_max_new_tokens,
            batch_size=opts.batch_size,
            store_rollouts=opts.store_rollouts,
            show_progress=self.ctx.is_main,
        )
        self.summary = RunSummary(
            self.task,
            out_dir,
            label=_run_label(opts, method),
            method=method,
            judge=self.scorer.judge.name if self.scorer.judge else None,
            sequential=opts.sequential,
            checkpoints=opts.checkpoints,
        )

    def config(self, data_paths: list[Path]) -> dict:
        """What the results depend on; a rerun into the same directory must match it (``limit`` may
        grow)."""
        o = self.opts
        config: dict[str, Any] = {
            "benchmark": self.task.name,
            "editor": self.method.name,
            "hparams": self.hp_dict,
            "data": {p.name: file_sha256(p) for p in data_paths},
            "mode": "sequential" if o.sequential else "single",
            "sequential": o.sequential,
            "max_new_tokens": self.editing.max_new_tokens,
        }
        # only when set: the directories of runs without checkpoints keep resuming
        if o.checkpoints:
            config["checkpoints"] = o.checkpoints
        # how, not what: a resume may change them (store.RUN_KERNEL_KEYS)
        if o.cases_at_once > 1:
            config["cases_at_once"] = o.cases_at_once
        if o.sequences_at_once > 1:
            config["sequences_at_once"] = o.sequences_at_once
        config.update(self.task.run_config(o.task_options, self.scorer.judge, self.probe.enabled))
        return config

    def load_cases(self) -> tuple[Any, list[Path]]:
        """The selected cases, and the input files their results depend on."""
        o = self.opts
        # the requests carry the method's own editing prompt, so `--set editing_prompt=...` takes
        # effect
        template = self.hp_dict.get("editing_prompt") or EDIT_PROMPT
        cases, paths = self.task.load(
            self.data_dir, o, self.scorer.client, self.cache_dir, template
        )
        return _selected(cases, o, paths[0]), paths

    def run(self) -> dict:
        """Run (or resume) this process's share, then merge every process's records into the
        summary."""
        ctx, d = self.ctx, self.directory
        self.scorer.probe()
        # the main process fills shared caches and repairs files; the others then read them
        with ctx.main_first():
            cases, paths = self.load_cases()
            ids = [str(c) for c in cases["case_id"]]
            blocks = units(len(ids), self.opts.sequential)
            done = d.open(
                self.config(paths),
                ids,
                blocks,
                sequential=bool(self.opts.sequential),
                retry_failed=self.opts.retry_failed,
            )
            self.scorer.rejudge(d.results, cases, ids)
            mine = ctx.shard(list(enumerate(blocks)))
            self._mine = [i for _, unit in mine for i in unit]
            todo = [(b, unit) for b, unit in mine if not all(ids[i] in done for i in unit)]
            self.probe.load()
            if todo or (ctx.is_main and self.probe.lacks_before()):
                self.editing.ensure_model()
        n_mine, n_todo = sum(len(u) for _, u in mine), sum(len(u) for _, u in todo)
        if ctx.world > 1:
            log.info(
                "%s: %d of %d case(s) are this process's, %d to do, into %s",
                ctx.describe(),
                n_mine,
                len(ids),
                n_todo,
                d.results.path.name,
            )
        elif n_todo < len(ids):
            log.info(
                "resuming %s: %d of %d case(s) already done", d.path, len(ids) - n_todo, len(ids)
            )
        mmlu_before = self.probe.before(self.editing.unedited) if ctx.is_main else None
        if n_todo:
            d.record_environment(
                [ids[i] for _, unit in todo for i in unit],
                cases_at_once=self.opts.cases_at_once,
                sequences_at_once=self.opts.sequences_at_once,
            )
            self._edit_cases(cases, todo, n_mine, n_todo)
        # every process has written its last case; no results file changes from here on
        ctx.barrier()
        records = merge_results(d.path, ids)
        if mmlu_before is None:
            mmlu_before = self.probe.before(None)
        summary = self.summary.build(
            mmlu_before, [records[cid] for cid in ids], d.recorded_hparams(self.hp_dict)
        )
        if ctx.is_main:
            self.summary.write(summary)
        return summary

    def _edit_cases(
        self, cases: Any, todo: list[tuple[int, list[int]]], n_mine: int, n_todo: int
    ) -> None:
        """The case loop over this process's cases still to do, under a progress bar."""
        desc = f"{self.task.name} {self.summary.label}"
        with _progress_bar(self.ctx, desc, n_mine, n_todo) as progress:
            self._loop(cases, todo, progress)

    def _loop(self, cases: Any, todo: list[tuple[int, list[int]]], progress: Progress) -> None:
        d = self.directory
        if self.opts.sequential:
            SequentialLoop(
                self.editing,
                cases,
                self.scorer,
                self.probe,
                d.results,
                d.sequence,
                self.opts.checkpoints or (),
                self.opts.sequences_at_once,
            ).run(todo, progress)
        else:
            SingleLoop(
                self.editing, cases, self.scorer, self.probe, d.results, self.opts.cases_at_once
            ).run([u[0] for _, u in todo], progress, mine=self._mine)


def run_benchmark(opts: RunOptions, context: ProcessContext | None = None) -> dict:
    """Run (or resume) one benchmark for one hparams file; returns the summary written to
    summary.json.

    Under a multi-process launch every process calls this with the same options, runs its share and
    returns the same summary; only the main process writes it. ``context`` defaults to this
    process's (``benchmarks.run.distributed.process_context``); passing one runs that shard of an
    N-process layout without a process group (its barriers do nothing), e.g. to drive shards one
    after another.
    """
    run = _Run(opts, context)
    try:
        with run.directory.writing():
            return run.run()
    finally:
        run.scorer.close()


#: ``--cases-at-once auto`` off a GPU. On CPU an extra case costs little memory (with
#: ``cases_per_pass`` auto each case trains in its own pass: its adapter, Adam and rollout rows are
#: what grows, docs/perf/plan-cases-smollm2.json); a batch's rollout decodes 2 rows per request, 24
#: for four MQuAKE-uns cases, where a CPU decode step of 16 SmolLM2 rows already costs about 3 times
#: one row's; and a batch cut short by a stop is edited again whole, so a small B loses little. A
#: middle choice, not a measured optimum.
CPU_CASES_AT_ONCE = 4
#: the memory planner's workload (``hpse_easyedit.planner.WORKLOADS``) of each task
PLAN_WORKLOADS = {"mquake-uns": "mquake", "unkebench": "unkebench"}


def auto_cases_at_once(opts: RunOptions, method: MethodSpec, hp: Any) -> int:
    """``--cases-at-once auto`` as a number, said in one log line: 1 for a method that edits one
    case at a time; on a CUDA device the memory planner's largest B for the card's free memory and
    this run's lengths (``planner.plan_cases_at_once``: the hparams' rollout length, the task's
    prompt and passage lengths, the answer batch and length); elsewhere ``CPU_CASES_AT_ONCE``.
    ``--limit`` and ``--cases`` bound it."""
    import torch

    from hpse_easyedit.loading import resolve_device
    from hpse_easyedit.planner import (
        ALLOCATOR_SLACK,
        GIB,
        WORKLOADS,
        largest_cases,
        plan_cases_at_once,
    )

    bounds = [n for n in (len(opts.cases) if opts.cases else None, opts.limit) if n]
    if method.edit_cases is None or method.resume is None:
        log.info("--cases-at-once auto: 1 (%s edits one case at a time)", method.name)
        return 1
    parallel = getattr(hp, "model_parallel", False)
    device = None if parallel else torch.device(resolve_device(getattr(hp, "device", "cpu")))
    if device is None or device.type != "cuda":
        chosen = min([CPU_CASES_AT_ONCE, *bounds])
        log.info(
            "--cases-at-once auto: %d (%s; the memory planner plans one GPU)",
            chosen,
            "model_parallel" if device is None else f"the default on {device}",
        )
        return chosen
    task = TASKS[opts.benchmark]
    workload = dataclasses.replace(
        WORKLOADS[PLAN_WORKLOADS.get(task.name, "unkebench")],
        max_new_tokens=hp.max_new_tokens,
        answer_tokens=opts.max_new_tokens or task.default_max_new_tokens,
        answer_rows=opts.batch_size,
    )
    free, _ = torch.cuda.mem_get_info(device)
    plan = plan_cases_at_once(hp, workload)
    fits = largest_cases(plan, free / GIB / (1 + ALLOCATOR_SLACK))
    chosen = max(1, min([fits, *bounds]))
    log.log(
        logging.INFO if fits else logging.WARNING,
        "--cases-at-once auto: %d (%s: %.1f GiB free; the memory planner: %.2f GiB of tensors for "
        "one case, +%.3f GiB per extra case%s)",
        chosen,
        device,
        free / GIB,
        plan["solo_peak_gib"],
        plan["per_case_gib"],
        "; even one case may not fit" if not fits else "",
    )
    return chosen


def _hparams(
    method: MethodSpec, opts: RunOptions, context: ProcessContext | None
) -> tuple[Any, dict, Any, ProcessContext]:
    """The requested hparams and their plain dict (what config.json and summary.json record), the
    hparams this process runs (each process of a multi-process launch on the device accelerate gave
    it), and the process context. A method's ``preflight`` refuses what cannot run (e.g. covariance
    statistics that cannot be had) before any model is loaded."""
    requested = method.load_hparams(opts.hparams, opts.overrides)
    if method.preflight is not None:
        method.preflight(requested)
    hp_dict = json_plain(method.hparams_dict(requested))
    ctx = context or process_context(
        model_parallel=bool(hp_dict.get("model_parallel")),
        timeout=timedelta(hours=opts.dist_timeout_hours),
    )
    if ctx.device is None:
        return requested, hp_dict, requested, ctx
    running = method.load_hparams(opts.hparams, [*opts.overrides, f"device={ctx.device}"])
    return requested, hp_dict, running, ctx


def _out_dir(opts: RunOptions) -> Path:
    return Path(opts.out_dir or default_out_dir(opts.benchmark, opts.hparams, opts.overrides))


def _run_label(opts: RunOptions, method: str) -> str:
    """The run's label in tables: ``--label``, else the method, the hparams file and the overrides
    that change what is computed."""
    return opts.label or f"{method} ({Path(opts.hparams).stem})" + "".join(
        f" {o}" for o in _computing(opts.overrides)
    )


def _selected(cases: Any, o: RunOptions, data_file: Path) -> Any:
    """The ``--cases`` of ``cases`` (all without it); none selected, or an id not there, is a
    ``UsageError``."""
    if o.cases:
        ids = [str(c) for c in cases["case_id"]]
        missing = [c for c in o.cases if c not in set(ids)]
        if missing:
            within = f" among the first {o.limit} cases (--limit)" if o.limit else ""
            raise UsageError(
                f"--cases: no case_id {', '.join(missing)}{within} in {data_file}; "
                "check the ids (the case_id field of the data file)"
                + (" or raise --limit" if within else "")
            )
        wanted = set(o.cases)
        cases = cases.select([i for i, c in enumerate(ids) if c in wanted])
    if len(cases) == 0:
        raise UsageError(
            f"no cases selected from {data_file} (limit {o.limit}); check the data file"
        )
    return cases


@contextlib.contextmanager
def _progress_bar(ctx: ProcessContext, desc: str, n_mine: int, n_todo: int) -> Iterator[Progress]:
    """A progress callback over this process's ``n_mine`` cases, ``n_todo`` of them still to do:
    the main process draws a bar, the others log a line per update."""
    from tqdm.auto import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    desc += f" [{ctx.rank}/{ctx.world}]" if ctx.world > 1 else ""
    with (
        logging_redirect_tqdm(),
        tqdm(
            total=n_mine,
            initial=n_mine - n_todo,
            desc=desc,
            unit="case",
            dynamic_ncols=True,
            disable=not ctx.is_main,
        ) as bar,
    ):
        finished = [n_mine - n_todo]

        def progress(n: int, postfix: Mapping[str, str] | None) -> None:
            finished[0] += n
            bar.update(n)
            if postfix:
                bar.set_postfix(postfix)
            if not ctx.is_main:  # only the main process draws a progress bar
                log.info("%s: %d of %d case(s) done", ctx.describe(), finished[0], n_mine)

        yield progress
