"""Benchmarks of the HPSE paper: UnKEBench and MQuAKE-uns loaders, metrics, judge, resumable runner.

Modules, in the order data flows:
``datasets`` (edit cases, MMLU subset) -> ``methods`` (which method edits) -> ``runner`` (edit,
generate, restore; one JSON line per case via ``store``) -> ``tasks`` (per-case scores from
``metrics`` and the ``judge``) -> ``report`` (paper-layout tables, step-in plot). ``mmlu`` scores
the locality check; ``distributed`` shares a run out over the processes of an ``accelerate launch``.
``cli`` is the command line; ``paths`` the data and cache directories; ``llm`` the LLM client (one
cache) and the judge prompts.
"""

from .datasets import DataError, load_mmlu_subset, load_mquake_uns, load_unkebench
from .distributed import ProcessContext, process_context
from .judge import JudgeSettings, LexicalJudge, LLMJudge, make_judge
from .methods import MethodSpec, get_method, register_method
from .report import paper_table, plot_stepin_rates
from .runner import RunOptions, run_benchmark
from .store import ConfigMismatchError, IncompleteRunError

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
