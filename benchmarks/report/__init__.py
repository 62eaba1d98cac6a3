"""Tables in the paper's layout, the step-in-rate plot, and the command that reports runs.

The paper's main table puts UnKEBench (Jnt, Dmp, Div, Avg, MMLU) and MQuAKE-uns (Ind, Cmp, Avg) side
by side, one row per method, numbers in percent with one decimal. ``paper_table`` renders that as
markdown for any subset of the two benchmarks; a benchmark a row has no summary for shows dashes.

    python -m benchmarks report runs/mq-lora runs/mq-hpse  # the paper-layout table
    # one self-contained HTML file:
    python -m benchmarks report runs/mq-lora runs/mq-hpse --html runs/mq.html

``__main__`` is that command; ``html`` writes the HTML report, which adds the case-by-case
comparison with intervals, the step-in plot, and every case with its questions, answers, verdicts
and rollouts.
"""

from ..analysis.plots import plot_stepin_rates
from ..run.tables import judge_note, paper_cells, paper_table

__all__ = ["judge_note", "paper_cells", "paper_table", "plot_stepin_rates"]
