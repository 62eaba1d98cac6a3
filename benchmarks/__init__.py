"""Benchmarks of the HPSE paper: UnKEBench and MQuAKE-uns, their metrics and judges, a resumable
runner, the analyses of RESULTS.md and the performance tools, in rooms by stage:

``records`` (the files a run writes) <- ``tasks`` (cases, metrics, judges, locality probes) <-
``run`` (options, methods, the run directory, the case loop, scoring, summaries, the runner) <-
``analysis`` (finished runs compared, rescored, tabulated; RESULTS.md checked) <- ``report`` (the
HTML report). ``perf`` (what an edit costs) reads ``tasks`` and stands apart. A room imports only
the rooms to its left. Each room's ``__init__`` says what it owns.

``python -m benchmarks COMMAND`` is the command line (``__main__``). The modules' old paths
(``benchmarks.paired``, ``python -m benchmarks.paired``, ...) still work for one release
(``_moved``).
"""

from importlib import import_module

from ._moved import install as _install_old_paths

_install_old_paths()

#: the package's names and the room each comes from, imported on first use, so that a command
#: that needs one room (``perf`` on a machine without ``datasets``, say) imports only that room
_EXPORTS = {
    "ConfigMismatchError": "records.store",
    "IncompleteRunError": "records.store",
    "paper_table": "report",
    "plot_stepin_rates": "report",
    "ProcessContext": "run.distributed",
    "process_context": "run.distributed",
    "MethodSpec": "run.methods",
    "get_method": "run.methods",
    "register_method": "run.methods",
    "RunOptions": "run.runner",
    "run_benchmark": "run.runner",
    "DataError": "tasks.datasets",
    "load_mmlu_subset": "tasks.datasets",
    "load_mquake_uns": "tasks.datasets",
    "load_unkebench": "tasks.datasets",
    "JudgeSettings": "tasks.judge",
    "LexicalJudge": "tasks.judge",
    "LLMJudge": "tasks.judge",
    "make_judge": "tasks.judge",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value
