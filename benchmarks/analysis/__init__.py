"""Reading finished runs: finished run directories loaded (``runs``), the statistics
(``stats``: bootstraps by case and by sequence), two or more runs case by case (``paired``, its
command), the answers rescored for recitation (``recitation``), case studies (``case_studies``),
continual sequences (``continual``), variants of one method (``variants``), twin runs
(``twin``), UnKE's own metrics added to runs (``unke_metrics``), the step-in plot (``plots``),
RESULTS.md regenerated and checked (``study``), several methods run and compared (``compare``) and
one case's rollout shown token by token (``inspect_rollout``).

May import ``run``, ``tasks`` and ``records``; ``report`` sits above it."""
