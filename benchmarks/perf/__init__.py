"""What an edit costs, apart from the benchmark runs: the perf report (``editors``, its command
``python -m benchmarks perf``; ``measure`` measures, ``machine`` the machine's floors, ``tables``
the table), batched edits (``batched``), the captured inner step (``captured``), the half-precision
backward (``half_backward``), the GPU path rehearsed without a GPU (``gpu_path``, ``gpu_batched``,
both counting with ``meta_ops``) and the memory planner checked (``plan_check``).
``benchmarks/gpu_run.sh`` runs them on a GPU.

May import ``tasks`` (data, MMLU) and ``records``; nothing imports it but its own command.
``from benchmarks.perf import main`` is the perf report's command (the module's old place, kept
for one release)."""

__all__ = ["main"]


def __getattr__(name: str):
    if name == "main":  # imported on use: ``python -m benchmarks perf`` runs it fresh
        from .editors import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
