"""Two runs over the same cases, compared case by case: the difference of each metric with its spread.

With 20 or 100 cases a difference of a few points between two tables can be noise. This reads the
results files of two run directories (``runs/A`` and ``runs/B``, any number of processes each),
keeps the cases both have, and reports per metric: the two means, the mean paired difference B - A
with a 95% bootstrap confidence interval (cases resampled with replacement, the same resample for
both runs), and how many cases B won, tied and lost. ``Avg`` is the per-case mean of the task's
metrics (MQuAKE-uns: Ind and Cmp; UnKEBench: Jnt, Dmp, Div), as in the paper's tables. For
MQuAKE-uns it adds ``AnsDiv``, a diagnostic outside the paper: 1 - SelfBLEU-4 among all answers of a
case, which exposes an editor that answers every question by reciting the passage. Also for
MQuAKE-uns, "composition given the hops": in how many cases a run answered every single-hop question
(Ind = 1), and in how many of those it also answered the multi-hop question (Cmp). An editor whose
facts are retrievable one by one but cannot be chained shows a low second number.

    python -m benchmarks.paired runs/mq20-lora runs/mq20-hpse --out runs/mq20-paired.json
    # + case studies:
    python -m benchmarks.paired runs/mq20-lora runs/mq20-hpse --show 3 --data ../shared/data

With more than two runs (the baseline first), it prints one row per run on the cases ALL of them
finished, each with its Avg difference from the baseline (interval, wins / ties / losses):

    python -m benchmarks.paired runs/mq-lora runs/mq-hpse runs/mq-hpse-nonll \\
        --label LoRA --label HPSE --label "w/o NLL"

``--cases ID,ID,...`` keeps only those cases (e.g. the MQuAKE-uns cases with two or more edits).
``--whole-word-aliases N`` (MQuAKE-uns) rescores the stored answers with a stricter check than the
official one: aliases of at most N characters must occur as whole words, so Germany's alias "de" no
longer counts inside "despite". A diagnostic for editors that recite long passages; the paper's
numbers use the official check (the default).

``--recitation`` (needs ``--data``) adds recitation diagnostics beside the official table, never in
its place: every stored answer rescored (a) cut to its first sentence and (b) cut to its first 32
tokens (``--recitation-tokens``) of the runs' model tokenizer (``hparams.model_name`` of the runs'
config, loaded offline through ``hpse_easyedit``'s model cache; when it cannot be loaded, words and
punctuation marks are counted instead and the table says so), and the share of each official score
that survives. MQuAKE-uns: Ind and Cmp by the check in use. UnKEBench: Div always; Jnt and Dmp only
for runs judged by the offline lexical judge, which is rerun on the cut answers; Jnt/Dmp from an LLM
judge cannot be recomputed offline, so those runs get Div alone. No model time: only stored answers
are read.
"""  # noqa: E501

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from hpse_easyedit.cli import DEBUG_FLAG, DEBUG_HELP, OneLineParser  # argparse errors: one line

from .store import IncompleteRunError, merge_results, write_new_json
from .tasks import TASKS

__all__ = [
    "CUTS",
    "add_reading_arguments",
    "bootstrap_ci",
    "hierarchical_bootstrap_ci",
    "load_run",
    "model_token_spans",
    "multi_report",
    "multi_table",
    "paired_report",
    "paired_table",
    "recitation_report",
    "recitation_table",
    "sequence_differences",
    "sequence_note",
]

METRICS = {name: task.metrics for name, task in TASKS.items()}


def load_run(run_dir: str | Path) -> tuple[str, dict[str, dict]]:
    """(benchmark name, {case_id: record}) of a run directory, the cases whose edit diverged left
    out (they have no scores; the run's summary counts them); ``DIR@N``: the run's checkpoint after
    N edits of each sequence (``--checkpoints``); clear errors for anything else."""
    from .sequence import checkpoint_records, split_checkpoint

    run_dir, checkpoint = split_checkpoint(run_dir)
    config = run_dir / "config.json"
    if not config.is_file():
        raise FileNotFoundError(
            f"{run_dir}: no config.json; pass a directory written by a benchmark run (--out DIR)"
        )
    benchmark = json.loads(config.read_text(encoding="utf-8")).get("benchmark")
    if benchmark not in METRICS:
        raise ValueError(
            f"{config}: 'benchmark' is {benchmark!r}; expected one of {sorted(METRICS)}"
        )
    if checkpoint is not None:
        found = checkpoint_records(run_dir)
        if checkpoint not in found:
            raise ValueError(
                f"{run_dir}@{checkpoint}: {run_dir} has no checkpoint after {checkpoint} edits "
                f"(it has {sorted(found) or 'none'}); give DIR@N with one of them"
            )
        records = found[checkpoint]
    else:
        try:
            records = merge_results(run_dir, None)
        except IncompleteRunError as err:  # a case recorded twice
            raise ValueError(str(err)) from None
    return benchmark, {
        cid: r for cid, r in records.items() if "failed" not in r
    }  # a failed edit has no scores


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def bootstrap_ci(
    values: Sequence[float], *, resamples: int = 10000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values``: the ``(1 - level) / 2`` and ``(1 +
    level) / 2`` percentiles (``np.percentile``) of ``resamples`` means of ``len(values)`` values
    drawn with replacement by ``np.random.default_rng(seed)``.

    A vectorised numpy bootstrap rather than ``scipy.stats.bootstrap``, which refuses a sample of
    one value (a paired report over one common case has one).
    """
    if not len(values):
        raise ValueError("no values")
    x = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(resamples, len(x)))].mean(axis=1)
    lo, hi = np.percentile(means, [(1 - level) / 2 * 100, (1 + level) / 2 * 100])
    return float(lo), float(hi)


def hierarchical_bootstrap_ci(
    groups: Sequence[Sequence[float]],
    *,
    resamples: int = 10000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of values that come in groups: the sequences of
    continual editing, whose cases share one edited model and so are not independent of each other.

    Each resample draws ``len(groups)`` groups with replacement, then within each drawn group as
    many values as it holds, with replacement, and takes the mean of all the values drawn (two
    stages, so the interval holds the spread between groups as well as within them); percentiles as
    in ``bootstrap_ci``. One group leaves no spread between groups to draw from: ``ValueError``.
    """
    arrays = [np.asarray(g, dtype=float) for g in groups]
    if any(not len(a) for a in arrays):
        raise ValueError("an empty group")
    if len(arrays) < 2:
        raise ValueError(
            f"{len(arrays)} group(s): no interval between groups exists; resample the cases instead"
        )
    rng = np.random.default_rng(seed)
    chosen = rng.integers(0, len(arrays), size=(resamples, len(arrays)))
    sums = np.zeros(chosen.shape)
    sizes = np.array([len(a) for a in arrays])[chosen]
    for k, a in enumerate(arrays):  # the second stage: each drawn group's values, redrawn
        where = chosen == k
        sums[where] = a[rng.integers(0, len(a), size=(int(where.sum()), len(a)))].sum(axis=1)
    means = sums.sum(axis=1) / sizes.sum(axis=1)
    lo, hi = np.percentile(means, [(1 - level) / 2 * 100, (1 + level) / 2 * 100])
    return float(lo), float(hi)


def sequence_differences(
    diffs: Sequence[float], sequences: Sequence[Any], *, resamples: int = 10000, seed: int = 0
) -> dict[str, Any]:
    """Per-case differences ``diffs`` grouped by the sequence each case was edited in
    (``sequences``, one label per case): their mean, the mean difference of each sequence in the
    order they first appear (``per_sequence``), and ``hierarchical_bootstrap_ci`` of the mean over
    sequences, then cases (``ci95``; None for one sequence: no interval between sequences)."""
    groups: dict[Any, list[float]] = {}
    for d, seq in zip(diffs, sequences):
        groups.setdefault(seq, []).append(d)
    values = list(groups.values())
    return {
        "mean": _mean(list(diffs)),
        "per_sequence": [_mean(v) for v in values],
        "ci95": list(hierarchical_bootstrap_ci(values, resamples=resamples, seed=seed))
        if len(values) > 1
        else None,
    }


def sequence_note(seq: Mapping[str, Any], what: str = "Avg difference") -> str:
    """One line on ``sequence_differences``: each sequence's difference and the interval over
    sequences, or that one sequence has none."""
    per = ", ".join(f"{d:+.1f}" for d in seq["per_sequence"])
    if seq["ci95"] is None:
        return (
            f"one sequence ({what} {per}): no between-sequence interval exists; the interval "
            "above resamples its cases"
        )
    lo, hi = seq["ci95"]
    return (
        f"{len(seq['per_sequence'])} sequences, {what} per sequence {per}; sequences, then cases "
        f"within them, resampled: {seq['mean']:+.1f} [{lo:+.1f}, {hi:+.1f}]"
    )


# Not a paper metric: 1 - SelfBLEU-4 among ALL of a MQuAKE-uns case's answers. An editor that
# answers every question by reciting the passage scores near 0 here, and can still pass the
# substring check.
ANSWER_DIVERSITY = "AnsDiv"


def _composition_line(label: str, comp: Mapping[str, int]) -> str:
    k, n = comp["composed"], comp["all_hops"]
    share = f" ({100 * k / n:.0f}%)" if n else ""
    return (
        f"{label}: every single hop answered in {n} of {comp['cases']} cases; "
        f"the multi-hop question too in {k} of those {n}{share}"
    )


def _case_values(rec: Mapping[str, Any], metrics: Sequence[str]) -> dict[str, float]:
    vals = {m: float(rec[m]) for m in metrics}
    vals["Avg"] = _mean([vals[m] for m in metrics])
    answers = rec.get("answers") or {}
    if "single_hop" in answers:
        from .metrics import diversity

        div = diversity([*answers.get("single_hop", []), *answers.get("multi_hop", [])])
        if div is not None:
            vals[ANSWER_DIVERSITY] = div
    return vals


def paired_report(
    dir_a: str | Path,
    dir_b: str | Path,
    *,
    resamples: int = 10000,
    seed: int = 0,
    runs: tuple[tuple[str, dict], tuple[str, dict]] | None = None,
) -> dict:
    """Per-metric paired comparison of run B against run A on the cases both finished (values in
    percent).

    ``runs``: the two directories' ``load_run`` results when the caller already has them.
    """
    (bench_a, recs_a), (bench_b, recs_b) = runs or (load_run(dir_a), load_run(dir_b))
    if bench_a != bench_b:
        raise ValueError(
            f"{dir_a} is a {bench_a} run but {dir_b} is a "
            f"{bench_b} run; compare runs of one benchmark"
        )
    common = sorted(set(recs_a) & set(recs_b), key=lambda c: (len(c), c))
    if not common:
        raise ValueError(f"{dir_a} and {dir_b} have no finished case in common")
    metrics = METRICS[bench_a]
    a = [_case_values(recs_a[c], metrics) for c in common]
    b = [_case_values(recs_b[c], metrics) for c in common]
    out: dict[str, Any] = {
        "benchmark": bench_a,
        "a": str(dir_a),
        "b": str(dir_b),
        "n_cases": len(common),
        "only_in_a": len(recs_a) - len(common),
        "only_in_b": len(recs_b) - len(common),
        "cases": common,
        "metrics": {},
    }
    from .rollouts import stepin_rate_by_round

    out["stepin_rate_by_round"] = {
        "a": stepin_rate_by_round([recs_a[c] for c in common]),
        "b": stepin_rate_by_round([recs_b[c] for c in common]),
    }
    task = TASKS[bench_a]
    comp_a, comp_b = (
        task.composition([recs_a[c] for c in common]),
        task.composition([recs_b[c] for c in common]),
    )
    if comp_a is not None:
        out["composition_given_hops"] = {"a": comp_a, "b": comp_b}
    extra = [ANSWER_DIVERSITY] if all(ANSWER_DIVERSITY in v for v in (*a, *b)) else []
    sequences = _sequences(recs_a, recs_b, common)
    for m in (*metrics, "Avg", *extra):
        xa, xb = [100 * v[m] for v in a], [100 * v[m] for v in b]
        diff = [y - x for x, y in zip(xa, xb)]
        lo, hi = bootstrap_ci(diff, resamples=resamples, seed=seed)
        out["metrics"][m] = {
            "a": _mean(xa),
            "b": _mean(xb),
            "diff": _mean(diff),
            "diff_ci95": [lo, hi],
            "a_ci95": list(bootstrap_ci(xa, resamples=resamples, seed=seed)),
            "b_ci95": list(bootstrap_ci(xb, resamples=resamples, seed=seed)),
            "b_wins": sum(d > 1e-9 for d in diff),
            "ties": sum(abs(d) <= 1e-9 for d in diff),
            "b_losses": sum(d < -1e-9 for d in diff),
        }
        if m == "Avg" and sequences:
            out["metrics"][m]["sequences"] = (
                sequence_differences(diff, sequences, resamples=resamples, seed=seed)
                if sequences != "differ"
                else "differ"
            )
    return out


def _sequences(
    recs_a: Mapping[str, Mapping], recs_b: Mapping[str, Mapping], common: Sequence[str]
) -> list[Any] | str | None:
    """The sequence (``block``) each common case was edited in, where a run edited them in
    sequences (continual editing): run A's, else run B's; "differ" when both did, in other
    sequences; None when neither did (single editing)."""
    cut = [
        [recs[c].get("block") for c in common]
        for recs in (recs_a, recs_b)
        if all(recs[c].get("block") is not None for c in common)
    ]
    if not cut:
        return None
    return cut[0] if all(c == cut[0] for c in cut) else "differ"


def _sequence_line(avg: Mapping[str, Any], label: str) -> str | None:
    """The line under a table on an Avg difference's sequences (None: single editing)."""
    seq = avg.get("sequences")
    if not seq:
        return None
    if seq == "differ":
        return (
            f"{label}: the two runs edited these cases in different sequences; no interval over "
            "sequences applies"
        )
    return f"{label}: {sequence_note(seq)}"


def _scoring_note(report: Mapping[str, Any]) -> str:
    n = report.get("whole_word_aliases") or 0
    return (
        f"; rescored: aliases of <= {n} characters as whole words (not the official check)"
        if n
        else ""
    )


def paired_table(report: Mapping[str, Any], label_a: str = "A", label_b: str = "B") -> str:
    """Markdown: one row per metric, means with 95% intervals, the paired difference and
    win/tie/loss."""
    lines = [
        f"{report['benchmark']}, {report['n_cases']} cases "
        f"in both runs (A = {report['a']}, B = {report['b']})" + _scoring_note(report),
        "",
        f"| metric | {label_a} | {label_b} | {label_b} - "
        f"{label_a} (95% CI) | {label_b} wins / ties / losses |",
        "|---|---:|---:|---:|---:|",
    ]
    for m, r in report["metrics"].items():
        lines.append(
            f"| {m} | {r['a']:.1f} [{r['a_ci95'][0]:.1f}, {r['a_ci95'][1]:.1f}] | "
            f"{r['b']:.1f} [{r['b_ci95'][0]:.1f}, {r['b_ci95'][1]:.1f}] | "
            f"{r['diff']:+.1f} [{r['diff_ci95'][0]:+.1f}, {r['diff_ci95'][1]:+.1f}] | "
            f"{r['b_wins']} / {r['ties']} / {r['b_losses']} |"
        )
    if ANSWER_DIVERSITY in report["metrics"]:
        lines.append(
            f"\n{ANSWER_DIVERSITY} is a diagnostic, not a paper metric: 1 - SelfBLEU-4 among all "
            "answers of a case (near 0 when every question "
            "is answered by reciting the same passage)."
        )
    seq = _sequence_line(report["metrics"]["Avg"], f"Avg, {label_b} - {label_a}")
    if seq:
        lines.append("\nContinual editing, the cases' sequences: " + seq)
    for key, label in (("a", label_a), ("b", label_b)):
        rates = report.get("stepin_rate_by_round", {}).get(key) or []
        if any(r is not None for r in rates):
            lines.append(
                f"\n{label}: step-in rate by round "
                + ", ".join("-" if r is None else f"{100 * r:.1f}%" for r in rates)
            )
    comp = report.get("composition_given_hops")
    if comp:
        lines.append("\nComposition given the hops:")
        lines += [
            f"- {_composition_line(label, comp[key])}"
            for key, label in (("a", label_a), ("b", label_b))
        ]
    return "\n".join(lines) + "\n"


def multi_report(
    dirs: Sequence[str | Path],
    *,
    resamples: int = 10000,
    seed: int = 0,
    loaded: Sequence[tuple[str, dict]] | None = None,
) -> dict:
    """Every run against the first (the baseline) on the cases ALL runs finished: one
    ``paired_report`` each.

    ``loaded``: the directories' ``load_run`` results when the caller already has them.
    """
    if len(dirs) < 2:
        raise ValueError(
            "give at least two run directories: the baseline first, then the runs compared with it"
        )
    loaded = list(loaded) if loaded is not None else [load_run(d) for d in dirs]
    benches = {b for b, _ in loaded}
    if len(benches) > 1:
        raise ValueError(
            f"the runs mix benchmarks ({', '.join(sorted(benches))}); compare runs of one benchmark"
        )
    common = set.intersection(*(set(recs) for _, recs in loaded))
    if not common:
        raise ValueError(f"the runs {', '.join(map(str, dirs))} have no finished case in common")
    kept = [(b, {c: recs[c] for c in common}) for b, recs in loaded]
    pairs = [
        paired_report(dirs[0], d, resamples=resamples, seed=seed, runs=(kept[0], k))
        for d, k in zip(dirs[1:], kept[1:])
    ]
    return {
        "benchmark": loaded[0][0],
        "runs": [str(d) for d in dirs],
        "n_cases": len(common),
        "not_in_all": {str(d): len(recs) - len(common) for d, (_, recs) in zip(dirs, loaded)},
        "pairs": pairs,
    }


def multi_table(report: Mapping[str, Any], labels: Sequence[str]) -> str:
    """Markdown: one row per run (means with 95% intervals) and its Avg difference from the first
    run."""
    pairs = report["pairs"]
    metrics = [m for m in pairs[0]["metrics"] if all(m in p["metrics"] for p in pairs)]
    base = labels[0]
    lines = [
        f"{report['benchmark']}, {report['n_cases']} cases finished by all {len(labels)} runs"
        + _scoring_note(report),
        "",
        "| run | "
        + " | ".join(metrics)
        + f" | Avg - {base} (95% CI) | wins / ties / losses vs {base} |",
        "|---|" + "---:|" * (len(metrics) + 2),
    ]

    def cell(r: Mapping[str, Any], side: str) -> str:
        lo, hi = r[f"{side}_ci95"]
        return f"{r[side]:.1f} [{lo:.1f}, {hi:.1f}]"

    lines.append(
        f"| {base} | " + " | ".join(cell(pairs[0]["metrics"][m], "a") for m in metrics) + " | | |"
    )
    for label, p in zip(labels[1:], pairs):
        avg = p["metrics"]["Avg"]
        lines.append(
            f"| {label} | "
            + " | ".join(cell(p["metrics"][m], "b") for m in metrics)
            + f" | {avg['diff']:+.1f} [{avg['diff_ci95'][0]:+.1f}, {avg['diff_ci95'][1]:+.1f}]"
            + f" | {avg['b_wins']} / {avg['ties']} / {avg['b_losses']} |"
        )
    seqs = [
        _sequence_line(p["metrics"]["Avg"], f"{label} - {base}")
        for label, p in zip(labels[1:], pairs)
    ]
    if any(seqs):
        lines += ["", "Continual editing, the cases' sequences (Avg):"]
        lines += [f"- {line}" for line in seqs if line]
    rates = [(base, pairs[0]["stepin_rate_by_round"]["a"])] + [
        (label, p["stepin_rate_by_round"]["b"]) for label, p in zip(labels[1:], pairs)
    ]
    shown = [(label, r) for label, r in rates if any(x is not None for x in r or [])]
    if shown:
        lines.append("")
    for label, r in shown:
        lines.append(
            f"- {label}: step-in rate by round "
            + ", ".join("-" if x is None else f"{100 * x:.1f}%" for x in r)
        )
    if "composition_given_hops" in pairs[0]:
        comps = [(base, pairs[0]["composition_given_hops"]["a"])] + [
            (label, p["composition_given_hops"]["b"]) for label, p in zip(labels[1:], pairs)
        ]
        lines += ["", "Composition given the hops:"] + [
            f"- {_composition_line(label, c)}" for label, c in comps
        ]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ recitation diagnostics
CUTS = ("official", "first sentence", "first {n} tokens")


def model_token_spans(model_name: str) -> tuple[Callable[[str], list[tuple[int, int]]] | None, str]:
    """``(token_spans, description)``: character spans of ``model_name``'s tokens (its tokenizer
    loaded offline through ``hpse_easyedit``'s model cache, special tokens left out), or
    ``(None, ...)`` naming the fallback (words and punctuation marks) when that tokenizer cannot be
    loaded."""
    try:
        from transformers import AutoTokenizer

        from hpse_easyedit.loading import (
            model_source,
        )  # the same lookup load_model uses, without loading weights

        tok = AutoTokenizer.from_pretrained(model_source(model_name))
        if not tok.is_fast:
            raise ValueError("not a fast tokenizer, so no character offsets")
    except Exception as err:  # any failure leaves the documented fallback, named in the table
        logging.getLogger(__name__).warning(
            "the tokenizer of %s could not be loaded (%s); "
            "counting words and punctuation marks instead",
            model_name,
            (str(err).splitlines() or [""])[0][:160],
        )
        return (
            None,
            "words and punctuation marks (fallback: the runs' tokenizer could not be loaded)",
        )

    def spans(text: str) -> list[tuple[int, int]]:
        return [
            tuple(o)
            for o in tok(text, add_special_tokens=False, return_offsets_mapping=True)[
                "offset_mapping"
            ]
        ]

    return spans, f"tokens of {model_name}'s tokenizer"


def _recitation_values(benchmark: str, rec: Mapping[str, Any]) -> dict[str, float | None]:
    metrics = METRICS[benchmark]
    vals = {m: None if rec.get(m) is None else float(rec[m]) for m in metrics}
    vals["Avg"] = (
        None if any(vals[m] is None for m in metrics) else _mean([vals[m] for m in metrics])
    )
    return vals


def recitation_report(
    dirs: Sequence[str | Path],
    loaded: Sequence[tuple[str, dict]],
    cases: Mapping[str, Mapping],
    *,
    tokens: int = 32,
    token_spans: Callable[[str], Sequence[tuple[int, int]]] | None = None,
    token_kind: str = "words and punctuation marks",
    whole_word_max: int = 0,
    resamples: int = 10000,
    seed: int = 0,
) -> dict:
    """Every run's scores on the cases ALL runs finished, official and with every answer cut to its
    first sentence and to its first ``tokens`` tokens (``metrics.cut_to_tokens`` with
    ``token_spans``), in percent, with the share of the official mean kept and, per cut, each run's
    Avg difference from the first run (bootstrap interval, wins / ties / losses). ``cases``: case id
    -> loaded case of the data."""
    from .metrics import cut_to_tokens, first_sentence

    benches = {b for b, _ in loaded}
    if len(benches) != 1:
        raise ValueError(
            f"the runs mix benchmarks ({', '.join(sorted(benches))}); compare runs of one benchmark"
        )
    benchmark = benches.pop()
    common = sorted(set.intersection(*(set(recs) for _, recs in loaded)), key=lambda c: (len(c), c))
    if not common:
        raise ValueError(f"the runs {', '.join(map(str, dirs))} have no finished case in common")
    cuts: dict[str, Callable[[str], str] | None] = {
        CUTS[0]: None,
        CUTS[1]: first_sentence,
        CUTS[2].format(n=tokens): lambda t: cut_to_tokens(t, tokens, token_spans),
    }
    metrics = (*METRICS[benchmark], "Avg")
    task = TASKS[benchmark]
    per_cut: dict[str, list[list[dict]]] = {}
    for name, cut in cuts.items():
        runs = []
        for _, recs in loaded:
            kept = task.rescore(
                {c: recs[c] for c in common}, cases, cut=cut, whole_word_max=whole_word_max
            )
            runs.append([_recitation_values(benchmark, kept[c]) for c in common])
        per_cut[name] = runs
    out: dict[str, Any] = {
        "benchmark": benchmark,
        "runs": [str(d) for d in dirs],
        "n_cases": len(common),
        "cases": common,
        "tokens": tokens,
        "token_kind": token_kind,
        "whole_word_aliases": whole_word_max,
        "cuts": {},
    }
    official = per_cut[CUTS[0]]
    for name, runs in per_cut.items():
        rows = []
        for i, vals in enumerate(runs):
            row: dict[str, Any] = {}
            for m in metrics:
                xs = [v[m] for v in vals]
                if any(x is None for x in xs):
                    continue
                mean_ = 100 * _mean(xs)
                base = (
                    100 * _mean([v[m] for v in official[i]])
                    if all(v[m] is not None for v in official[i])
                    else None
                )
                row[m] = {"mean": mean_, "kept": None if not base else mean_ / base}
            if i and "Avg" in row and all(v["Avg"] is not None for v in runs[0]):
                diff = [100 * (b["Avg"] - a["Avg"]) for a, b in zip(runs[0], vals)]
                lo, hi = bootstrap_ci(diff, resamples=resamples, seed=seed)
                row["Avg_diff"] = {
                    "diff": _mean(diff),
                    "ci95": [lo, hi],
                    "wins": sum(d > 1e-9 for d in diff),
                    "ties": sum(abs(d) <= 1e-9 for d in diff),
                    "losses": sum(d < -1e-9 for d in diff),
                }
            rows.append(row)
        out["cuts"][name] = rows
    return out


def recitation_table(report: Mapping[str, Any], labels: Sequence[str]) -> str:
    """Markdown: per run and cut, each metric's mean and (cut rows) the share of the official mean
    kept, with the Avg difference from the first run."""
    metrics = [*METRICS[report["benchmark"]], "Avg"]
    base = labels[0]
    lines = [
        f"Recitation diagnostics (not the paper's metrics), {report['benchmark']}, "
        f"{report['n_cases']} cases of all {len(labels)} runs: every answer rescored as it is "
        f"(official), cut to its first sentence, and cut to its first {report['tokens']} "
        f"{report['token_kind']}; in brackets the share of the official score kept"
        + _scoring_note(report),
        "",
        "| run | answers | "
        + " | ".join(metrics)
        + f" | Avg - {base} (95% CI) | wins / ties / losses vs {base} |",
        "|---|---|" + "---:|" * (len(metrics) + 2),
    ]
    for i, label in enumerate(labels):
        for name, rows in report["cuts"].items():
            row = rows[i]
            cells = []
            for m in metrics:
                if m not in row:
                    cells.append("n/a")
                    continue
                kept = row[m]["kept"]
                share = "" if name == CUTS[0] or kept is None else f" ({100 * kept:.0f}%)"
                cells.append(f"{row[m]['mean']:.1f}{share}")
            d = row.get("Avg_diff")
            diff = (
                ""
                if d is None
                else f" {d['diff']:+.1f} [{d['ci95'][0]:+.1f}, {d['ci95'][1]:+.1f}] | {d['wins']} "
                f"/ {d['ties']} / {d['losses']} "
            )
            lines.append(f"| {label} | {name} | " + " | ".join(cells) + f" |{diff or ' | '}|")
    note = TASKS[report["benchmark"]].recitation_note
    if note:
        lines.append("\n" + note)
    return "\n".join(lines) + "\n"


def _qa_rows(
    benchmark: str, case: Mapping[str, Any], recs: Sequence[Mapping]
) -> list[tuple[str, str, list[str]]]:
    """(question, expected, [answer of each record]) for every question of one case the case studies
    show."""
    return [
        (
            q.text,
            "(the passage)" if q.expected is None else " / ".join(q.expected[:3]),
            [q.answer(r) for r in recs],
        )
        for q in TASKS[benchmark].case_questions(case)
        if q.in_case_studies
    ]


def case_studies(
    report: Mapping[str, Any],
    data_dir: str | Path,
    n: int,
    *,
    label_a: str = "A",
    label_b: str = "B",
    max_chars: int = 240,
    records: tuple[dict, dict] | None = None,
    before: tuple[str, dict] | None = None,
) -> str:
    """Markdown for the ``n`` cases where the two runs differ most on Avg (ties broken by case
    order): every question with its expected answer and both runs' answers (cut to ``max_chars``).

    ``records``: both runs' ``{case_id: record}`` when the caller already read them. ``before``:
    (label, records) of a third run, e.g. the UNEDITED reference, shown as the first answer column.
    """
    benchmark = report["benchmark"]
    recs_a, recs_b = records or (load_run(report["a"])[1], load_run(report["b"])[1])
    metrics = METRICS[benchmark]
    common = sorted(set(recs_a) & set(recs_b), key=lambda c: (len(c), c))
    gap = {
        c: _case_values(recs_b[c], metrics)["Avg"] - _case_values(recs_a[c], metrics)["Avg"]
        for c in common
    }
    chosen = sorted(common, key=lambda c: -abs(gap[c]))[:n]
    by_id = {str(c["case_id"]): c for c in TASKS[benchmark].load_cases(data_dir)}

    def cut(text: str) -> str:
        text = " ".join(str(text).split()).replace("|", "/")
        return text if len(text) <= max_chars else text[:max_chars] + " ..."

    columns = ([before[0]] if before else []) + [label_a, label_b]
    out = []
    for cid in chosen:
        case = by_id.get(cid)
        if case is None:
            raise ValueError(
                f"case {cid} of {report['a']} is not in the {benchmark} data under {data_dir}; "
                "pass the --data directory the runs used"
            )
        recs = [recs_a[cid], recs_b[cid]]
        if before:
            if cid not in before[1]:
                raise ValueError(
                    f"case {cid} has no result in the --before "
                    "run; finish it on the same cases first"
                )
            recs.insert(0, before[1][cid])
        scores = " ".join(
            f"{m} {100 * recs_a[cid][m]:.0f} -> {100 * recs_b[cid][m]:.0f}" for m in metrics
        )
        out += [
            f"#### case {cid} ({label_a} -> {label_b}: {scores})",
            "",
            "| question | expected | " + " | ".join(columns) + " |",
            "|---|---|" + "---|" * len(columns),
        ]
        out += [
            "| " + " | ".join(cut(x) for x in (q, g, *ans)) + " |"
            for q, g, ans in _qa_rows(benchmark, case, recs)
        ]
        out.append("")
    return "\n".join(out)


def _rescored(
    loaded: list[tuple[str, dict]], data_dir: str | None, whole_word_max: int
) -> list[tuple[str, dict]]:
    """``loaded`` with every record rescored by its task's ``rescore(..., whole_word_max=...)``
    against the data under ``data_dir``; only tasks that ``rescores_aliases`` (MQuAKE-uns) have
    aliases to rescore."""
    from .datasets import DataError, default_data_dir

    if any(not TASKS[bench].rescores_aliases for bench, _ in loaded):
        able = [t for t in TASKS.values() if t.rescores_aliases]
        raise ValueError(
            f"--whole-word-aliases rescores {' / '.join(t.title for t in able)} answers; these "
            f"runs are not all {' / '.join(t.name for t in able)} runs"
        )
    task = TASKS[loaded[0][0]]
    try:
        cases = {str(c["case_id"]): c for c in task.load_cases(data_dir or default_data_dir())}
    except DataError as err:
        raise ValueError(
            f"--whole-word-aliases needs the {task.title} data the runs used: {err}"
        ) from None
    return [
        (bench, task.rescore(recs, cases, whole_word_max=whole_word_max)) for bench, recs in loaded
    ]


def load_cases(benchmark: str, data_dir: str | Path | None, why: str) -> dict[str, dict]:
    """{case id: case} of the benchmark's data under ``data_dir`` (default: the default data
    directory)."""
    from .datasets import DataError, default_data_dir

    try:
        cases = TASKS[benchmark].load_cases(data_dir or default_data_dir())
    except DataError as err:
        raise ValueError(
            f"{why} needs the {benchmark} data the runs used (--data): {err}"
        ) from None
    return {str(c["case_id"]): c for c in cases}


def run_model_name(run_dirs: Sequence[str | Path]) -> str:
    """The ``hparams.model_name`` all the runs' ``config.json`` name (an error if they differ)."""
    from .sequence import split_checkpoint

    names = {
        json.loads((split_checkpoint(d)[0] / "config.json").read_text(encoding="utf-8"))
        .get("hparams", {})
        .get("model_name")
        for d in run_dirs
    }
    names.discard(None)
    if len(names) != 1:
        raise ValueError(
            f"the runs name {len(names)} models ({', '.join(sorted(names)) or 'none'}) in "
            "config.json hparams.model_name; --recitation cuts tokens with one model's tokenizer"
        )
    return names.pop()


def _recitation(args: argparse.Namespace, loaded: Sequence[tuple[str, dict]]) -> dict:
    benchmark = loaded[0][0]
    cases = load_cases(benchmark, args.data, "--recitation")
    spans, kind = model_token_spans(run_model_name(args.runs))
    return recitation_report(
        args.runs,
        loaded,
        cases,
        tokens=args.recitation_tokens,
        token_spans=spans,
        token_kind=kind,
        whole_word_max=args.whole_word_aliases,
        resamples=args.resamples,
    )


def add_reading_arguments(parser: argparse.ArgumentParser) -> None:
    """``--resamples`` and ``--debug``, as every reading tool (paired, continual, variants) takes
    them."""
    parser.add_argument(
        "--resamples", type=int, default=10000, help="bootstrap resamples (default 10000)"
    )
    parser.add_argument(DEBUG_FLAG, action="store_true", help=DEBUG_HELP)


def _parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m benchmarks.paired", description=__doc__.split("\n")[0])
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="run directories: the baseline first (e.g. "
        "runs/mq-lora), then one or more runs compared with it",
    )
    parser.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="NAME",
        help="row/column label of each RUN, in order (repeat; default: the directory names)",
    )
    parser.add_argument(
        "--label-a", help="with two runs: label of the first (same as the first --label)"
    )
    parser.add_argument("--label-b", help="with two runs: label of the second")
    add_reading_arguments(parser)
    parser.add_argument(
        "--out", help="also write the report as JSON here (refuses to overwrite an existing file)"
    )
    parser.add_argument(
        "--plot",
        metavar="PNG",
        help="also plot every run's mean step-in rate per round (common cases)",
    )
    parser.add_argument(
        "--show",
        type=int,
        default=0,
        metavar="N",
        help="two runs only: also print the N cases where they "
        "differ most: questions, expected and both answers",
    )
    parser.add_argument(
        "--before",
        metavar="RUN",
        help="with --show: a third run (e.g. the UNEDITED "
        "reference) whose answers form the first column",
    )
    parser.add_argument(
        "--before-label", default="before", help="column label of --before (default: before)"
    )
    parser.add_argument(
        "--data",
        help="data directory the runs used, for --show and --whole-word-aliases "
        "(default: $HPSE_DATA_DIR or ../shared/data)",
    )
    parser.add_argument(
        "--cases",
        type=lambda v: [c.strip() for c in v.split(",") if c.strip()],
        metavar="ID,ID,...",
        help="compare on these case ids only (those every run finished), e.g. the MQuAKE-uns "
        "cases with two or more edits",
    )
    parser.add_argument(
        "--whole-word-aliases",
        type=int,
        default=0,
        metavar="N",
        help="MQuAKE-uns: rescore the stored answers so that aliases of at most N characters must "
        "match as whole words (3 stops 'de' matching inside 'despite'); a diagnostic, default 0 = "
        "the official substring check",
    )
    parser.add_argument(
        "--recitation",
        action="store_true",
        help="also print the recitation diagnostics: every stored answer rescored cut to its "
        "first sentence and to its first --recitation-tokens tokens, with the share of each "
        "official score kept (needs --data; no model time)",
    )
    parser.add_argument(
        "--recitation-tokens",
        type=int,
        default=32,
        metavar="N",
        help="with --recitation: the token cut (default 32 tokens of the runs' model tokenizer)",
    )
    return parser


def _checked_labels(parser: OneLineParser, args: Any) -> list[str]:
    """The label of each run; a combination of options that does not fit is a one-line error."""
    if args.recitation_tokens < 1:
        parser.error(f"--recitation-tokens {args.recitation_tokens}: give a number of tokens >= 1")
    if len(args.runs) < 2:
        parser.error("give at least two run directories (the baseline first)")
    labels = list(args.label) or [Path(r).name for r in args.runs]
    if len(args.runs) == 2:
        labels = [
            args.label_a or labels[0],
            args.label_b or (labels[1] if len(labels) > 1 else Path(args.runs[1]).name),
        ]
    elif args.label_a or args.label_b:
        parser.error("--label-a/--label-b are for two runs; with more, give one --label per run")
    if len(labels) != len(args.runs):
        parser.error(f"{len(labels)} --label for {len(args.runs)} runs; give one per run or none")
    if args.before and not args.show:
        parser.error("--before adds a column to the --show case studies; pass --show N too")
    if args.show and len(args.runs) > 2:
        parser.error(
            "--show compares two runs; pass the two runs whose answers you want side by side"
        )
    if args.out and Path(args.out).exists():
        parser.error(f"--out {args.out} exists; choose a new file")
    if args.whole_word_aliases < 0:
        parser.error(
            f"--whole-word-aliases {args.whole_word_aliases}: "
            "give a length >= 0 (0 = the official check)"
        )
    return labels


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    labels = _checked_labels(parser, args)
    try:
        loaded = [load_run(r) for r in args.runs]
        if args.cases is not None:
            if not args.cases:
                raise ValueError(
                    "--cases names no case id; give comma-separated ids, e.g. --cases 6,24,68"
                )
            wanted = set(args.cases)
            loaded = [
                (bench, {c: rec for c, rec in recs.items() if c in wanted})
                for bench, recs in loaded
            ]
        if args.whole_word_aliases:
            loaded = _rescored(loaded, args.data, args.whole_word_aliases)
        if len(args.runs) == 2:
            runs = (loaded[0], loaded[1])
            report = paired_report(args.runs[0], args.runs[1], resamples=args.resamples, runs=runs)
            report["whole_word_aliases"] = args.whole_word_aliases
            series = {
                labels[0]: report["stepin_rate_by_round"]["a"],
                labels[1]: report["stepin_rate_by_round"]["b"],
            }
            print(paired_table(report, *labels), end="")
        else:
            report = multi_report(args.runs, resamples=args.resamples, loaded=loaded)
            report["whole_word_aliases"] = args.whole_word_aliases
            series = {labels[0]: report["pairs"][0]["stepin_rate_by_round"]["a"]}
            series.update(
                {lab: p["stepin_rate_by_round"]["b"] for lab, p in zip(labels[1:], report["pairs"])}
            )
            print(multi_table(report, labels), end="")
        if args.recitation:
            report["recitation"] = _recitation(args, loaded)
            print("\n" + recitation_table(report["recitation"], labels), end="")
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.plot:
        from .rollouts import plot_stepin_rates

        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        plot_stepin_rates(
            series,
            args.plot,
            title=f"Step-in rate per round, {report['benchmark']}, {report['n_cases']} cases",
        )
        print(f"wrote {args.plot}")
    if args.show:
        from .datasets import DataError, default_data_dir

        try:
            before = (args.before_label, load_run(args.before)[1]) if args.before else None
            print(
                "\n"
                + case_studies(
                    report,
                    args.data or default_data_dir(),
                    args.show,
                    label_a=labels[0],
                    label_b=labels[1],
                    records=(runs[0][1], runs[1][1]),
                    before=before,
                )
            )
        except (DataError, FileNotFoundError, ValueError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    if args.out:
        write_new_json(args.out, report)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
