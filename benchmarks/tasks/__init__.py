"""What a benchmark is: reading its cases (``datasets``, from the data directory of ``paths``),
scoring an answer (``metrics``; UnKE's own BLEU/ROUGE/BERTScore in ``unke_scores``; NLTK's
sentence BLEU with each text's n-grams counted once in ``bleu``; the lexical and
LLM judges in ``judge``, their client and prompts in ``llm``), the locality probes
(``probe``: the protocol and the no-op probe; ``mmlu``: the MMLU probe) and the tasks themselves
(``task``: ``Task``, UnKEBench, MQuAKE-uns, the ``TASKS`` registry).

May import ``records``; nothing above it (``run``, ``analysis``, ``report``, ``perf``)."""

from . import task as _task
from .task import *  # noqa: F403  (the tasks, as ``benchmarks.tasks`` gave them before the rooms)

__all__ = list(_task.__all__)
