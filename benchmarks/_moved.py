"""The modules' old paths (``benchmarks.paired``, ``benchmarks.runner``, ...), kept for one
release: ``import benchmarks.paired`` gives the very module object of ``benchmarks.analysis.paired``
(what is patched on one is patched on the other), and ``python -m benchmarks.paired`` runs that
module's command as before the wing was split into rooms. New code imports the new paths; the
command line is ``python -m benchmarks COMMAND`` (``benchmarks/__main__.py``).

One meta-path finder with one table instead of 35 re-export files, so the rooms stay the only
folders of the wing."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import CodeType, ModuleType

#: old module (under ``benchmarks``) -> its module now (under ``benchmarks``)
MOVED = {
    "store": "records.store",
    "sequence": "records.sequence",
    "rollouts": "records.rollouts",
    "paths": "tasks.paths",
    "datasets": "tasks.datasets",
    "metrics": "tasks.metrics",
    "judge": "tasks.judge",
    "llm": "tasks.llm",
    "llm.client": "tasks.llm.client",
    "llm.prompts": "tasks.llm.prompts",
    "unke_scores": "tasks.unke_scores",
    "mmlu": "tasks.mmlu",
    "run_options": "run.options",
    "methods": "run.methods",
    "references": "run.references",
    "distributed": "run.distributed",
    "run_dir": "run.run_dir",
    "scorer": "run.scorer",
    "case_loop": "run.case_loop",
    "summary": "run.summary",
    "runner": "run.runner",
    "cli": "run.cli",
    "paired": "analysis.paired",
    "continual": "analysis.continual",
    "variants": "analysis.variants",
    "twin": "analysis.twin",
    "unke_metrics": "analysis.unke_metrics",
    "study": "analysis.study",
    "compare": "analysis.compare",
    "inspect_rollout": "analysis.inspect_rollout",
    "perf_batched": "perf.batched",
    "perf_captured": "perf.captured",
    "perf_half_backward": "perf.half_backward",
    "perf_machine": "perf.machine",
    "perf_measure": "perf.measure",
    "perf_report": "perf.tables",
    "gpu_path": "perf.gpu_path",
    "gpu_batched": "perf.gpu_batched",
    "plan_check": "perf.plan_check",
}


class _OldPath(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``benchmarks.OLD`` and loads it as the module ``benchmarks.NEW`` itself."""

    def find_spec(self, name: str, path: object = None, target: object = None):
        old = name.partition(".")[2]
        if not name.startswith("benchmarks.") or old not in MOVED:
            return None
        return importlib.util.spec_from_loader(name, self, is_package=old == "llm")

    def create_module(self, spec) -> ModuleType:
        return importlib.import_module(self._new(spec.name))

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the new module ran when ``create_module`` imported it."""

    def get_code(self, name: str) -> CodeType:
        """``python -m benchmarks.OLD``: the new module's command, as ``python -m`` ran it."""
        return compile(
            f"import runpy\nrunpy.run_module({self._new(name)!r}, run_name='__main__')\n",
            f"<{name}, now {self._new(name)}>",
            "exec",
        )

    @staticmethod
    def _new(name: str) -> str:
        return "benchmarks." + MOVED[name.partition(".")[2]]


def install() -> None:
    """Put the finder on ``sys.meta_path`` once."""
    if not any(isinstance(f, _OldPath) for f in sys.meta_path):
        sys.meta_path.insert(0, _OldPath())  # before the path finders: a stale folder (an old
        # checkout's benchmarks/llm/__pycache__) must not become a namespace package
