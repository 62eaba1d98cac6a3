"""Running a benchmark: the options (``options``, ``cli`` for the ``run`` command line), which
method edits (``methods``, the reference rows in ``references``), the processes of a launch
(``distributed``), the run directory and its resume (``run_dir``), one case or one sequence at a
time with the locality probe (``case_loop``), scoring (``scorer``), the summary and its tables
(``summary``, ``tables``), and ``runner``, which ties them together.

May import ``tasks`` and ``records``; nothing above it (``analysis``, ``report``, ``perf``)."""
