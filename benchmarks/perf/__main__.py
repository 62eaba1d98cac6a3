"""``python -m benchmarks perf``: the perf report (``benchmarks.perf.editors``)."""

import runpy

runpy.run_module("benchmarks.perf.editors", run_name="__main__")
