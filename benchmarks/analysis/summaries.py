"""A finished run's summary recomputed from its files, and compared with the stored one.

``rebuild`` recomputes a finished run directory's summary from its files alone (what the runner
would write for its records now, plus UnKE's own metrics as ``benchmarks.analysis.unke_metrics
--write`` adds them) and ``summary_differences`` lists each field where a stored ``summary.json``
disagrees with it: ``python -m benchmarks study docs/study --check`` runs both on every committed
run. Two keys are provenance, kept from the stored summary and never compared (``PROVENANCE_KEYS``):
``label`` and ``out_dir``. Every other key is recomputed: the task's metrics and ``Avg``, the judge
counts, ``unke_metrics``, ``failed_cases``, the MMLU keys, ``n_cases``, ``stepin_rate_by_round``,
the mean edit and algorithm seconds the records hold, the run's description from ``config.json``
(``benchmark``, ``editor``, ``mode``, ``sequential``, ``judge``, ``hparams``) and every checkpoint's
summary. ``editor`` is the one recomputed key with two right values: the method's table label
(``LoRA + HPSE``), which the runner writes now, or the ``alg_name`` that config.json records
(``HPSE``), which it wrote before. Two parts of ``unke_metrics`` describe the machine, not the
records: ``Bert Score`` (the MiniLM cosine, computed only where that model is on the machine) is
compared where both summaries have it, and ``not_computed`` (why it is missing) never.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

from ..run.summary import PROVENANCE_KEYS, RunSummary

__all__ = ["rebuild", "summary_differences"]


def rebuild(
    run_dir: str | Path,
    stored: Mapping[str, Any],
    *,
    unke_cases: Mapping[str, Mapping[str, Any]] | None = None,
    encoder: Any = None,
    bert_reason: str = "",
) -> tuple[RunSummary, dict]:
    """The summary of the finished run directory ``run_dir`` recomputed from its files: its
    records, ``checkpoints.jsonl``, ``mmlu_before.json`` and ``config.json``, through
    ``RunSummary.build`` as the runner calls it, with ``stored``'s ``PROVENANCE_KEYS``; and the
    ``RunSummary`` whose ``write`` puts it in place (summary.json and table.md, as the runner does).

    An UnKEBench run whose records predate UnKE's own metrics gets them as
    ``benchmarks.analysis.unke_metrics
    --write`` adds them, from the stored answers and ``unke_cases`` (case id -> loaded case; needed
    only then). ``encoder``, ``bert_reason``: the MiniLM for ``Bert Score``, as that command loads
    it (None: left out, ``not_computed`` says so).
    """
    from ..records.store import merge_results
    from ..run.methods import method_label
    from ..tasks.task import TASKS
    from ..tasks.unke_scores import KEY

    run_dir = Path(run_dir)
    config = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    task = TASKS[config["benchmark"]]
    hparams = config.get("hparams") or {}
    summary = RunSummary(
        task,
        run_dir,
        label=stored.get("label", run_dir.name),
        method=method_label(str(config.get("editor")), hparams),
        judge=config.get("judge"),
        sequential=config.get("sequential"),
        checkpoints=config.get("checkpoints"),
    )
    records = sorted(merge_results(run_dir, None).values(), key=lambda r: r.get("index", 0))
    before = run_dir / "mmlu_before.json"
    mmlu_before = (
        json.loads(before.read_text(encoding="utf-8"))["MMLU_before"]
        if task.measures_mmlu and config.get("mmlu") and before.is_file()
        else None
    )
    out = summary.build(mmlu_before, records, hparams)
    out["out_dir"] = stored.get("out_dir", out["out_dir"])
    if stored.get("editor") == config.get("editor"):  # the name an earlier runner wrote
        out["editor"] = stored["editor"]
    if task.name == "unkebench" and KEY not in out:  # records written before UnKE's metrics
        from .unke_metrics import run_metrics

        if unke_cases is None:
            raise ValueError(
                f"{run_dir}: its records predate UnKE's own metrics, which are recomputed from its "
                "answers and the UnKEBench data; pass the data directory the run used"
            )
        out[KEY] = run_metrics(run_dir, unke_cases, encoder, bert_reason)
        for c, part in out.get("checkpoints", {}).items():
            if KEY not in part:
                part[KEY] = run_metrics(f"{run_dir}@{c}", unke_cases, encoder, bert_reason)
    return summary, out


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def summary_differences(stored: Any, rebuilt: Any, field: str = "") -> list[str]:
    """``field: stored X, recomputed Y`` for every field of a stored summary that differs from its
    ``rebuild`` (numbers to 1e-9, relative, so that a sum taken in another order agrees), a key one
    has and the other lacks included; ``PROVENANCE_KEYS`` at the top level are not compared, nor
    what depends on the machine rather than the records (see the module's docstring)."""
    from ..tasks.unke_scores import BERT

    if isinstance(stored, Mapping) and isinstance(rebuilt, Mapping):
        out = []
        for key in dict.fromkeys([*stored, *rebuilt]):
            name = f"{field}.{key}" if field else str(key)
            if not field and key in PROVENANCE_KEYS:
                continue
            # the machine's, not the records' (see the module's docstring)
            if key == "not_computed" or (key == BERT and (key not in rebuilt or key not in stored)):
                continue
            if key not in rebuilt or key not in stored:
                have = "absent" if key not in stored else f"{stored[key]!r}"
                want = "absent" if key not in rebuilt else f"{rebuilt[key]!r}"
                out.append(f"{name}: stored {_short(have)}, recomputed {_short(want)}")
            else:
                out += summary_differences(stored[key], rebuilt[key], name)
        return out
    if isinstance(stored, list) and isinstance(rebuilt, list) and len(stored) == len(rebuilt):
        return [
            d
            for i, (a, b) in enumerate(zip(stored, rebuilt))
            for d in summary_differences(a, b, f"{field}[{i}]")
        ]
    if _number(stored) and _number(rebuilt):
        same = math.isclose(stored, rebuilt, rel_tol=1e-9, abs_tol=1e-9)
    else:
        same = stored == rebuilt
    return (
        []
        if same
        else [f"{field}: stored {_short(repr(stored))}, recomputed {_short(repr(rebuilt))}"]
    )


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
