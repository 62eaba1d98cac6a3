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

from ._moved import install as _install_old_paths

_install_old_paths()

from .records.store import ConfigMismatchError, IncompleteRunError  # noqa: E402
from .report import paper_table, plot_stepin_rates  # noqa: E402
from .run.distributed import ProcessContext, process_context  # noqa: E402
from .run.methods import MethodSpec, get_method, register_method  # noqa: E402
from .run.runner import RunOptions, run_benchmark  # noqa: E402
from .tasks.datasets import DataError, load_mmlu_subset, load_mquake_uns, load_unkebench  # noqa: E402
from .tasks.judge import JudgeSettings, LexicalJudge, LLMJudge, make_judge  # noqa: E402

__all__ = [
    "ConfigMismatchError",
    "DataError",
    "IncompleteRunError",
    "MethodSpec",
    "JudgeSettings",
    "LLMJudge",
    "LexicalJudge",
    "ProcessContext",
    "RunOptions",
    "get_method",
    "load_mmlu_subset",
    "load_mquake_uns",
    "load_unkebench",
    "make_judge",
    "paper_table",
    "plot_stepin_rates",
    "process_context",
    "register_method",
    "run_benchmark",
]
