"""Watch HPSE inject a counterfactual passage into the embedded SmolLM2-135M-Instruct, offline.

The passage (``demo_passage.txt``, written for this project) introduces a fictional marine
biologist, Selma Varrick, born in Norway. Before the edit the model knows nothing about her; after
it, it should answer the atomic question (where she was born) and the two-hop question that needs
that fact (the official language of her birth country) from its weights alone, without the passage
in context.
"""

from __future__ import annotations

import logging
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Sequence

SUBJECT = "Selma Varrick"
ATOMIC = ("In which country was Selma Varrick born?", ("norway",))
TWO_HOP = (
    "What is the official language of the country where Selma Varrick was born?",
    ("norwegian",),
)
DEFAULT_HPARAMS = Path(__file__).resolve().parents[1] / "hparams" / "HPSE" / "smollm2-135m.yaml"


def _passage() -> str:
    return (
        resources.files("hpse_easyedit")
        .joinpath("demo_passage.txt")
        .read_text(encoding="utf-8")
        .strip()
    )


def _hit(answer: str, keys: Sequence[str]) -> str:
    return "yes" if any(k in answer.lower() for k in keys) else "no"


def run(hparams_path: str, overrides: Sequence[str], max_answer_tokens: int = 48) -> dict:
    """Edit, print before/after answers and per-round step-in rates; return what was measured."""
    from . import generate_answers, hpse_edit, load_model, restore_weights
    from .hparams import HPSEHyperParams

    t_start = time.perf_counter()
    hp = HPSEHyperParams.from_hparams(hparams_path).with_overrides(list(overrides))
    model, tok = load_model(hp)
    prompt = hp.editing_prompt.format(subject=SUBJECT)
    questions = [prompt, ATOMIC[0], TWO_HOP[0]]
    kwargs = {
        "max_new_tokens": max_answer_tokens,
        "template_kwargs": hp.chat_template_kwargs,
        "static_decode": hp.static_decode,
        "stop_every": hp.decode_stop_every,
    }
    print(
        f"Model: {hp.model_name} ({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M "
        f"parameters), executor {hp.executor}, {hp.rounds} "
        f"rounds x {hp.inner_steps} steps, lr {hp.lr:g}"
    )
    print(f"Passage ({SUBJECT}):\n  {_passage()}\n")
    before = generate_answers(model, tok, questions, **kwargs)

    t0 = time.perf_counter()
    result = hpse_edit(
        model, tok, [{"prompt": prompt, "subject": SUBJECT, "target_new": _passage()}], hp
    )
    edit_seconds = time.perf_counter() - t0
    after = generate_answers(result.model, tok, questions, **kwargs)

    labels = ["untargeted prompt", "atomic question", "two-hop question"]
    keys = [None, ATOMIC[1], TWO_HOP[1]]
    for label, q, b, a, k in zip(labels, questions, before, after, keys):
        print(f"--- {label}: {q}")
        print(f"  before: {b}")
        print(f"  after:  {a}")
        if k:
            print(f"  expected '{k[0]}': before {_hit(b, k)}, after {_hit(a, k)}")
    print("\nStep-in rate per round (share of rollout tokens the privileged teacher wrote):")
    for r in result.rounds:
        rate = "n/a" if r["stepin_rate"] is None else f"{100 * r['stepin_rate']:5.1f}%"
        print(
            f"  round {r['round']}: step-in {rate}, rollout {r['rollout_len']:.0f} tokens, "
            f"loss {r['loss']:.2f} -> {r['loss_last']:.2f}, {r['seconds']:.1f} s"
        )
    model = restore_weights(result.model, result.weights_copy)
    total = time.perf_counter() - t_start
    print(
        f"\nEdit time: {edit_seconds:.1f} s; whole demo: {total:.1f} "
        "s. The model was restored to its original weights."
    )
    return {
        "before": before,
        "after": after,
        "rounds": result.rounds,
        "edit_seconds": edit_seconds,
        "total_seconds": total,
        "atomic_after": _hit(after[1], ATOMIC[1]) == "yes",
        "two_hop_after": _hit(after[2], TWO_HOP[1]) == "yes",
    }


def main(argv: Sequence[str] | None = None) -> int:
    from .cli import OneLineParser  # argparse errors: one line, exit 2

    parser = OneLineParser(prog="python -m hpse_easyedit.demo", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--hparams", default=str(DEFAULT_HPARAMS), help="HPSE YAML (default: %(default)s)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override an hparams field, e.g. --set executor=ft_m or --set kl_weight=0",
    )
    parser.add_argument(
        "--max-answer-tokens", type=int, default=48, help="new tokens per answer (default 48)"
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log each round as it finishes"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    run(args.hparams, args.set, args.max_answer_tokens)
    return 0


if __name__ == "__main__":
    from .cli import run_cli  # bad input: one line on stderr, exit 2 (--debug: traceback)

    sys.exit(run_cli(main))
