"""What the privileged teacher injects: the first-round hybrid rollout of benchmark cases, step-ins marked.

For each case it builds the edit prompts exactly as ``hpse_edit`` does, draws the round-1 greedy
hybrid rollout on the UNEDITED model (student and teacher are then the same weights, the teacher
reading the passage), and prints the rollout with every stepped-in token in ``[[...]]``. It also
counts the step-ins whose token is a content word (letters, 3+ characters, not a function word) and
whether that word occurs in the case's passages: a teacher that steps in with passage words is
supplying the new facts; one that steps in with other words is injecting its own text. In a case
with several requests it also counts the content words that occur only in ANOTHER request's passage
(with ``teacher_facts=all`` the teacher of one request's rollout reads every passage and may pull
the student toward another subject). Several ``--gates`` groups compare settings on the same cases;
``--cases`` names the cases to inspect.

    python -m benchmarks inspect-rollout --hparams hparams/HPSE/smollm2-135m.yaml --limit 20 \\
        --gates tau=2,kappa=0.3 --gates tau=1,kappa=0.1 --out runs/inspect-gates.json
    python -m benchmarks inspect-rollout --hparams hparams/HPSE/smollm2-135m.yaml --cases 6,24,68 \
        --gates teacher_facts=request --gates teacher_facts=all
"""  # noqa: E501

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Sequence

from hpse_easyedit.cli import OneLineParser  # argparse errors: one line, exit 2

from ..tasks.task import TASKS, MQuAKEUns

__all__ = ["inspect_case", "main"]

_WORD = re.compile(r"^[A-Za-z\u00C0-\u024F]{3,}$")
# function words that occur in almost any passage, so "in the passage" says nothing about them
_STOP = frozenset(
    """the and for are was were has have had his her hers she him they them their its this that
these those with from into also been being which who whom whose what when where while than then
there here not but all any one two some such very more most many much our out over under about
after before""".split()
)


def inspect_case(model: Any, tok: Any, case: dict, hp: Any) -> dict:
    """Round-1 rollouts of one case's requests under ``hp``'s gates, with each step-in
    classified."""
    from hpse_easyedit.editor import edit_prompts
    from hpse_easyedit.prompts import stop_token_ids
    from hpse_easyedit.rollout import hybrid_rollout

    # without the loader's "prompt", each request takes hp.editing_prompt (so a group may override
    # it)
    prompts = edit_prompts(
        model, tok, [{k: v for k, v in r.items() if k != "prompt"} for r in case["requests"]], hp
    )
    own_passages = [r["target_new"].lower() for r in case["requests"]]
    passages = " ".join(own_passages)
    stops = stop_token_ids(model, tok)
    out = {"case_id": str(case["case_id"]), "requests": []}
    for i, p in enumerate(prompts):
        others = " ".join(t for j, t in enumerate(own_passages) if j != i)
        ro = hybrid_rollout(
            model,
            model,
            p.student_ids,
            p.teacher_ids,
            tau=hp.tau,
            kappa=hp.kappa,
            top_k=hp.top_k,
            max_new_tokens=hp.max_new_tokens,
            stop_ids=stops,
            hybrid=hp.rollout == "hybrid",
        )
        pieces, injected = [], []
        for t, s in zip(ro.tokens.tolist(), ro.stepped_in.tolist()):
            text = tok.decode([t])
            pieces.append(f"[[{text}]]" if s else text)
            if s:
                word = text.strip()
                content = bool(_WORD.match(word)) and word.lower() not in _STOP
                in_own = content and word.lower() in own_passages[i]
                injected.append(
                    {
                        "token": text,
                        "content_word": content,
                        "in_passage": content and word.lower() in passages,
                        "only_in_other_passage": content and not in_own and word.lower() in others,
                    }
                )
        out["requests"].append(
            {
                "subject": p.subject,
                "student_prompt": tok.decode(p.student_ids),
                "tokens": len(ro),
                "stepins": ro.stepin_count,
                "marked": "".join(pieces),
                "injected": injected,
            }
        )
    return out


def _summary(cases: Sequence[dict]) -> dict:
    inj = [i for c in cases for r in c["requests"] for i in r["injected"]]
    tokens = sum(r["tokens"] for c in cases for r in c["requests"])
    content = [i for i in inj if i["content_word"]]
    return {
        "rollout_tokens": tokens,
        "stepins": len(inj),
        "stepin_rate": len(inj) / max(tokens, 1),
        "content_word_stepins": len(content),
        "content_words_in_passage": sum(i["in_passage"] for i in content),
        "content_words_only_in_other_passage": sum(i["only_in_other_passage"] for i in content),
        "content_words_in_passage_share": (sum(i["in_passage"] for i in content) / len(content))
        if content
        else None,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(
        prog="python -m benchmarks inspect-rollout", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--hparams", required=True, help="HPSE YAML (its model, prompts and gates)")
    parser.add_argument(
        "--gates",
        action="append",
        default=[],
        metavar="K=V[,K=V]",
        help="a group of overrides to compare, e.g. "
        "tau=1,kappa=0.1 (repeat; default: the file as it is)",
    )
    parser.add_argument("--benchmark", default=MQuAKEUns.name, choices=sorted(TASKS))
    parser.add_argument("--data", help="data directory (default: $HPSE_DATA_DIR or ../shared/data)")
    parser.add_argument(
        "--limit", type=int, help="first N cases (default 5; with --cases: all of the file)"
    )
    parser.add_argument(
        "--cases",
        metavar="ID,ID,...",
        help="inspect only these case ids (comma-separated), "
        "e.g. the MQuAKE-uns cases with two edits",
    )
    parser.add_argument(
        "--print",
        type=int,
        default=2,
        dest="n_print",
        metavar="N",
        help="print the marked rollouts of the first N cases per setting (default 2)",
    )
    parser.add_argument(
        "--out", help="write every rollout and the counts as JSON (refuses to overwrite)"
    )
    args = parser.parse_args(argv)
    if args.out and Path(args.out).exists():
        parser.error(f"--out {args.out} exists; choose a new file")

    from hpse_easyedit import HPSEHyperParams, load_model

    from ..records.store import write_new_json
    from ..tasks.datasets import default_data_dir

    data = args.data or default_data_dir()
    wanted = [c.strip() for c in (args.cases or "").split(",") if c.strip()]
    if args.cases is not None and not wanted:
        parser.error("--cases names no case id; give comma-separated ids, e.g. --cases 6,24,68")
    limit = args.limit if args.limit is not None else (None if wanted else 5)
    cases = TASKS[args.benchmark].load_cases(data, limit=limit, subjects="auto")
    if wanted:
        by_id = {str(c["case_id"]): c for c in cases}
        missing = [c for c in wanted if c not in by_id]
        if missing:
            within = f" among the first {limit} cases (--limit)" if limit else ""
            parser.error(
                f"--cases: no case_id {', '.join(missing)}{within} in the {args.benchmark} data "
                f"under {data}; use ids from the data's case_id "
                "field (the runs' results.jsonl lists them)"
            )
        cases = [by_id[c] for c in wanted]
    base = HPSEHyperParams.from_hparams(args.hparams)
    model, tok = load_model(base)
    report = {
        "hparams": args.hparams,
        "benchmark": args.benchmark,
        "n_cases": len(cases),
        "settings": {},
    }
    for group in args.gates or [""]:
        overrides = [g for g in group.split(",") if g]
        hp = base.with_overrides(overrides)
        label = group or "as in the file"
        per_case = [inspect_case(model, tok, dict(c), hp) for c in cases]
        summary = _summary(per_case)
        report["settings"][label] = {"summary": summary, "cases": per_case}
        share = summary["content_words_in_passage_share"]
        print(
            f"## {label} (tau {hp.tau}, kappa {hp.kappa}): {summary['stepins']} step-ins in "
            f"{summary['rollout_tokens']} rollout tokens ({100 * summary['stepin_rate']:.1f}%); "
            f"{summary['content_word_stepins']} are content words, "
            f"{summary['content_words_in_passage']} of them in the passage"
            + ("" if share is None else f" ({100 * share:.0f}%)")
            + (
                f", {summary['content_words_only_in_other_passage']} "
                "only in another request's passage"
                if any(len(c["requests"]) > 1 for c in per_case)
                else ""
            )
        )
        for c in per_case[: args.n_print]:
            for r in c["requests"]:
                print(f"\ncase {c['case_id']}, {r['subject']!r}:\n{r['marked']}")
        print()
    if args.out:
        write_new_json(args.out, report)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    from hpse_easyedit.cli import (
        run_cli,
    )  # bad input: one line on stderr, exit 2 (--debug: traceback)

    from ..run.cli import benchmark_errors

    sys.exit(run_cli(main, extra=benchmark_errors()))
