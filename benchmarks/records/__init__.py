"""The files a run leaves behind, which every later stage reads: the results files, the config
check on resume and the atomic writes (``store``), a continual sequence's log, checkpoints and
replayed answers (``sequence``), and rollouts packed into a record (``rollouts``).

The bottom room: it imports nothing else of ``benchmarks``."""
