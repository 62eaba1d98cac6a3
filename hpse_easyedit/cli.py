"""``python -m hpse_easyedit edit``: one-off edits from the command line, answers before and after.

Example::

    python -m hpse_easyedit edit --hparams hparams/HPSE/smollm2-135m.yaml \\
        --subject "Selma Varrick" --passage-file passage.txt \\
        --ask "Where was Selma Varrick born?" --save runs/selma --set rounds=3

Every entry point of the project (this one, the demo, ``run_examples/*``, every ``python -m
benchmarks COMMAND``) runs its ``main`` through ``run_cli``: a user's mistake
(a bad hparams file or option, a missing file or model) is ONE line on stderr naming the field or
file and the fix, and exit code 2; the traceback only with ``--debug`` (or ``HPSE_DEBUG=1``).
SIGTERM and SIGHUP stop a command as Ctrl-C does: one ``interrupted:`` line saying what was kept
and that the same command goes on from there. A reader of stdout that goes away (``| head -1``)
stops nothing: what the command writes to disk is written, the rest of its printing goes nowhere.
Text the terminal's encoding cannot show (an emoji under ``PYTHONIOENCODING=ascii``) is printed as
backslash escapes rather than stopping the command.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from .atomic import write_aside
from .edit_requests import RequestError
from .editor import edit_prompts, hpse_edit
from .encoding import TextEncodingError, read_text
from .errors import (
    ENVIRONMENT_ERRNOS,
    Interrupted,
    UsageError,
    check_new_dir,
    check_positive,
    check_text_file,
    check_writable,
)
from .generation import generate_answers
from .hparams import HParamsError, HPSEHyperParams
from .loading import ModelNotFoundError
from .locks import DirectoryBusyError, ModelBusyError, writer_lock
from .model_io import save_edit
from .training import EditDivergedError, describe_loss

__all__ = [
    "OneLineFormatter",
    "OneLineParser",
    "build_parser",
    "main",
    "print_out",
    "run_cli",
    "user_error_types",
]

DEBUG_FLAG = "--debug"
DEBUG_HELP = "show the full traceback of an error instead of one line (or set HPSE_DEBUG=1)"


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr (``error: ...; see PROG --help``)
    and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {' '.join(message.split())}; see {self.prog} --help\n")


def user_error_types(extra: Sequence[type[BaseException]] = ()) -> tuple[type[BaseException], ...]:
    """Exceptions that mean bad input (one line, exit 2), not a bug (a traceback)."""
    from .integrations.easyedit_import import EasyEditNotFoundError, EasyEditVersionError

    return (
        UsageError,
        HParamsError,
        ModelNotFoundError,
        RequestError,
        EasyEditNotFoundError,
        EasyEditVersionError,
        DirectoryBusyError,
        ModelBusyError,
        EditDivergedError,
        TextEncodingError,
        FileNotFoundError,
        FileExistsError,
        IsADirectoryError,
        NotADirectoryError,
        *extra,
    )


class OneLineFormatter(logging.Formatter):
    """The log format of a run, except for ``run_cli``'s one-line errors, which read ``error: ...``
    exactly as every other entry point prints them."""

    def format(self, record: logging.LogRecord) -> str:
        prefix = getattr(record, "hpse_one_line", None)
        return f"{prefix}: {record.getMessage()}" if prefix else super().format(record)


def run_cli(
    main: Callable[[list[str]], int],
    argv: Sequence[str] | None = None,
    extra: Sequence[type[BaseException]] = (),
    logger: logging.Logger | None = None,
) -> int:
    """Run ``main(argv)``; a user error becomes one ``error: ...`` line on stderr and exit code 2,
    Ctrl-C one ``interrupted: ...`` line (what was finished, from ``Interrupted``) and exit code
    130, SIGTERM or SIGHUP the same line naming the signal and exit code 128 + its number (143,
    129). A closed stdout ends the command quietly (exit code 141) where its printing hit it.

    ``--debug`` (anywhere in ``argv``, removed before ``main`` sees it) or ``HPSE_DEBUG=1``
    re-raises the error with its traceback instead. With ``logger`` (and logging configured) the
    line goes through it (so log handlers see it), formatted as the same ``error: ...`` line
    (``OneLineFormatter``).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    debug = DEBUG_FLAG in args or os.environ.get("HPSE_DEBUG", "").lower() in ("1", "true", "yes")
    args = [a for a in args if a != DEBUG_FLAG]
    _escape_unencodable()

    def say(prefix: str, text: str) -> None:
        text = " ".join(text.split())
        try:
            if logger is not None and logging.getLogger().handlers:
                logger.error("%s", text, extra={"hpse_one_line": prefix})
            else:
                print(f"{prefix}: {text}", file=sys.stderr)
        except OSError:  # the terminal is gone (SIGHUP): nobody is there to read the line
            pass

    with _signals_as_interrupts() as caught:
        try:
            code = main(args)
            _flush_stdout()
            return code
        except KeyboardInterrupt as err:
            if debug:
                raise
            text = str(err) or "stopped by Ctrl-C"
            if caught:
                name = signal.Signals(caught[0]).name
                text = (
                    f"stopped by {name}; {err}"
                    if str(err)
                    else f"stopped by {name}; run the same command again to go on (what was "
                    "finished is kept)"
                )
            say("interrupted", text)
            return 128 + caught[0] if caught else 130
        except BrokenPipeError:  # the reader of stdout went away: as quiet as `yes | head -1`
            _drop_stdout()
            return 128 + signal.SIGPIPE
        except OSError as err:
            if debug or (
                err.errno not in ENVIRONMENT_ERRNOS and not isinstance(err, user_error_types(extra))
            ):
                raise
            if err.errno not in ENVIRONMENT_ERRNOS:
                say("error", _user_error_text(err))
                return 2
            where = f"{err.filename}: " if err.filename else ""
            say(
                "error",
                f"{where}{err.strerror or err}; free space or give a writable location, then run "
                "the same command again (what was finished is kept)",
            )
            return 2
        except user_error_types(extra) as err:
            if debug:
                raise
            say("error", _user_error_text(err))
            return 2


#: signals that stop a command as Ctrl-C does (``run_cli``): a job scheduler's or ``kill``'s
#: SIGTERM, and SIGHUP when the terminal closes
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _signals_as_interrupts() -> Any:
    """Inside: SIGTERM and SIGHUP raise ``KeyboardInterrupt`` where the program is, so every
    ``except KeyboardInterrupt`` that keeps finished work and says how to go on runs for them too;
    yields the list the first caught signal goes into. A second signal of the same kind then stops
    the process at once (the default). Only the main thread can take signal handlers."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return

    def stop(signum: int, frame: Any) -> None:
        if _in_finalizer(frame):  # Python would print an exception raised there and go on
            threading.Timer(0.05, os.kill, (os.getpid(), signum)).start()
            return
        caught.append(signum)
        signal.signal(signum, signal.SIG_DFL)
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, stop) for s in STOP_SIGNALS}
    try:
        yield caught
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _in_finalizer(frame: Any) -> bool:
    """Whether ``frame`` runs inside a ``__del__`` (a garbage-collected object's finaliser), where
    an exception is printed and dropped: the signal is then sent again, to land elsewhere."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _escape_unencodable() -> None:
    """stdout and stderr print what their encoding cannot show as backslash escapes."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError, io.UnsupportedOperation):
            stream.reconfigure(errors="backslashreplace")


def _drop_stdout() -> None:
    """From now on stdout goes to /dev/null: its reader went away (``| head -1``), and what is
    still buffered must not fail again at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
        pass  # not a file descriptor (a test's captured stdout)
    finally:
        os.close(devnull)


def _flush_stdout() -> None:
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _drop_stdout()


def print_out(*lines: str) -> None:
    """Print ``lines`` to stdout; a reader that went away (``| head -1``) is harmless: the rest
    goes nowhere and the command carries on with what it still has to do (save, write)."""
    try:
        for line in lines:
            print(line)
    except BrokenPipeError:
        _drop_stdout()


def _user_error_text(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    if isinstance(err, OSError) and err.filename and str(err.filename) not in text:
        text = f"{err.filename}: {text}"
    return text


def _save_elsewhere(
    result: Any, hparams: HPSEHyperParams, requests: list[dict], option_dir: Path, err: OSError
) -> UsageError:
    """``--save`` failed on the machine's state: save the edit whole to a temporary directory
    instead, so it is not lost; returns the one-line error that says where it is."""
    reason = err.strerror or str(err)
    fallback = write_aside(
        lambda path: save_edit(result, hparams, path, requests), "hpse-edit-", directory=True
    )
    if fallback is not None:
        return UsageError(
            f"--save {option_dir}: {reason}; the edit was saved whole to {fallback} instead: move "
            "it where you want it once space is freed"
        )
    return UsageError(
        f"--save {option_dir}: {reason}, and no temporary directory could hold the edit either; "
        "free space and run the same command again"
    )


def _print_answers(title: str, questions: Sequence[str], answers: Sequence[str]) -> None:
    print_out(f"\n== {title}", *(f"Q: {q}\nA: {a}\n" for q, a in zip(questions, answers)))


def _cmd_edit(args: argparse.Namespace) -> int:
    check_positive("--max-answer-tokens", args.max_answer_tokens, 1, "new tokens per answer")
    check_new_dir("--save", args.save)
    if args.save:
        check_writable("--save", args.save)
    hp = HPSEHyperParams.from_hparams(args.hparams).with_overrides(args.set)
    passages = []
    for path in args.passage_file:
        text = read_text(check_text_file("--passage-file", path)).strip()
        if not text:
            raise UsageError(
                f"--passage-file {path}: the file is empty; put the passage to inject in it"
            )
        passages.append(text)
    subjects = [s.strip() for s in args.subject]
    if len(subjects) != len(passages):
        raise UsageError(
            f"got {len(subjects)} --subject and {len(passages)} "
            "--passage-file; give one subject per passage"
        )
    if not all(subjects):
        raise UsageError("--subject is empty; give the topic phrase s of 'Introduce {s}.'")
    requests = [
        {"subject": s, "target_new": c, "prompt": hp.editing_prompt.format(subject=s)}
        for s, c in zip(subjects, passages)
    ]
    with writer_lock(args.save, "--save") if args.save else contextlib.nullcontext():
        return _edit_and_save(args, hp, requests)


def _edit_and_save(args: argparse.Namespace, hp: HPSEHyperParams, requests: list[dict]) -> int:
    from .loading import load_model

    model, tok = load_model(hp)
    edit_prompts(model, tok, requests, hp)  # a request that cannot be edited fails now, in one line
    questions = [r["prompt"] for r in requests] + list(args.ask)
    kwargs = {
        "max_new_tokens": args.max_answer_tokens,
        "template_kwargs": hp.chat_template_kwargs,
        "static_decode": hp.static_decode,
        "stop_every": hp.decode_stop_every,
    }
    _print_answers("before the edit", questions, generate_answers(model, tok, questions, **kwargs))
    t0 = time.perf_counter()
    try:
        result = hpse_edit(model, tok, requests, hp)
    except KeyboardInterrupt:
        raise Interrupted(
            "stopped during the edit; nothing was saved"
            + (f" to --save {args.save}" if args.save else "")
            + "; run the same command again to edit"
        ) from None
    seconds = time.perf_counter() - t0
    if args.save:  # saved first: nothing printed afterwards can lose the edit
        try:
            saved = save_edit(result, hp, args.save, requests)
        except OSError as err:
            if err.errno not in ENVIRONMENT_ERRNOS:
                raise
            raise _save_elsewhere(result, hp, requests, Path(args.save), err) from None
    print_out(f"\n== edit: {seconds:.1f} s")
    for r in result.rounds:
        rate = "n/a" if r["stepin_rate"] is None else f"{100 * r['stepin_rate']:.1f}%"
        print_out(
            f"round {r['round']}: step-in {rate}, "
            f"{describe_loss(r, hp.inner_steps)}, {r['seconds']:.1f} s"
        )
    _print_answers(
        "after the edit", questions, generate_answers(result.model, tok, questions, **kwargs)
    )
    if args.save:
        print_out(f"saved to {saved}")
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from .planner import CARDS_GIB, WORKLOADS, plan_with_knobs

    check_positive("--gpu-gib", args.gpu_gib, 1, "GiB of the card")
    check_positive("--layers", args.layers, 1, "layers of the planned model")
    hp = HPSEHyperParams.from_hparams(args.hparams).with_overrides(args.set)
    # first: what these hparams cannot do batched fails in one line before the longer plans
    batched = _cases_at_once_plan(hp, args) if args.cases_at_once else None
    plan = plan_with_knobs(hp, WORKLOADS[args.benchmark], args.gpu_gib, layers=args.layers)
    if batched is not None:
        plan["cases_at_once"] = batched
    if args.json:
        print_out(json.dumps(plan, indent=1))
        return 0
    print_out(
        f"{plan['model_name']} ({plan['dtype']}, {plan['executor']}), {plan['benchmark']}: peak "
        f"{plan['peak_gib']:.1f} GiB of tensors, {plan['card_gib']:.1f} GiB on the card (the "
        f"allocator's pool and the CUDA context, as measured on an H100)",
        f"Columns {', '.join(f'{c:g}G' for c in CARDS_GIB)}: whether the phase fits a card of that "
        "many GiB.",
    )
    cards = " ".join(f"{f'{c:g}G':>5}" for c in CARDS_GIB)
    print_out(f"{'phase':<16} {'GiB':>6} {cards}  knob for {args.gpu_gib:g} GiB")
    for name, phase in plan["phases"].items():
        fits = " ".join(f"{'yes' if phase['fits'][str(c)] else 'no':>5}" for c in CARDS_GIB)
        knob = "" if "knob" not in phase else (phase["knob"] or "none of the knobs is enough")
        print_out(f"{name:<16} {phase['peak_gib']:>6.2f} {fits}  {knob}".rstrip())
    if args.cases_at_once:
        _print_cases_at_once(plan["cases_at_once"])
    return 0


def _cases_at_once_plan(hp: HPSEHyperParams, args: argparse.Namespace) -> dict:
    """``plan --cases-at-once``: the batched engine's plan, with the largest B for every card and
    for ``--gpu-gib``."""
    from .planner import WORKLOADS, largest_cases, plan_cases_at_once, tensor_budget_gib

    batched = plan_cases_at_once(hp, WORKLOADS[args.benchmark], layers=args.layers)
    batched["largest_cases"].setdefault(
        f"{args.gpu_gib:g}", largest_cases(batched, tensor_budget_gib(args.gpu_gib))
    )
    return batched


def _print_cases_at_once(batched: dict) -> None:
    per_pass = batched["cases_per_pass"]
    print_out(
        f"\nCases at once (--cases-at-once B; cases_per_pass {per_pass}"
        + (": every case in one training pass, as on a GPU" if per_pass == "auto" else "")
        + f"): one case {batched['solo_peak_gib']:.3g} GiB of tensors, each extra case "
        f"+{batched['per_case_gib']:.3g} GiB (planned at B = {', '.join(batched['planned'])})",
    )
    cards = batched["largest_cases"]
    print_out(
        f"{'card':<16} " + " ".join(f"{f'{c}G':>5}" for c in cards),
        f"{'largest B':<16} " + " ".join(f"{b:>5}" for b in cards.values()),
    )


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m hpse_easyedit", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    edit = sub.add_parser("edit", help="edit a model with one or more passages and compare answers")
    edit.add_argument(
        "--hparams", required=True, help="HPSE YAML file, e.g. hparams/HPSE/smollm2-135m.yaml"
    )
    edit.add_argument(
        "--subject",
        action="append",
        required=True,
        help="topic phrase s of 'Introduce {s}.'; repeat once per --passage-file",
    )
    edit.add_argument(
        "--passage-file",
        action="append",
        required=True,
        help="text file holding one passage; repeatable",
    )
    edit.add_argument(
        "--ask",
        action="append",
        default=[],
        help="a question to answer before and after; repeatable",
    )
    edit.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override an hparams field, e.g. --set rounds=3 --set kl_weight=0",
    )
    edit.add_argument(
        "--save",
        metavar="DIR",
        help="write the edited weights (adapter or FT-M matrix) + hparams here",
    )
    edit.add_argument(
        "--max-answer-tokens", type=int, default=64, help="new tokens per answer (default 64)"
    )
    edit.add_argument("-v", "--verbose", action="store_true", help="log per-round progress")
    edit.add_argument(DEBUG_FLAG, action="store_true", help=DEBUG_HELP)
    edit.set_defaults(func=_cmd_edit)
    plan = sub.add_parser(
        "plan", help="predict the GPU memory of one edit per phase, without weights or a GPU"
    )
    plan.add_argument(
        "--hparams", required=True, help="HPSE YAML file, e.g. hparams/HPSE/qwen2.5-7b.yaml"
    )
    plan.add_argument(
        "--gpu-gib", type=float, default=24, help="the card's memory in GiB (default 24)"
    )
    plan.add_argument(
        "--benchmark",
        choices=("unkebench", "mquake"),
        default="unkebench",
        help="the sequence lengths of one edit: one "
        "UnKEBench passage, or three MQuAKE-uns passages",
    )
    plan.add_argument(
        "--layers", type=int, help="plan the model cut to this many layers (default: all)"
    )
    plan.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override an hparams field, e.g. --set "
        "executor=ft_m --set gradient_checkpointing=true",
    )
    plan.add_argument(
        "--json", action="store_true", help="print the plan as JSON (peak_gib, phases, fits, knobs)"
    )
    plan.add_argument(
        "--cases-at-once",
        action="store_true",
        help="also plan many independent edits at once (the runners' --cases-at-once B): the "
        "memory per extra case and, per card, the largest B that fits (JSON: cases_at_once)",
    )
    plan.add_argument(DEBUG_FLAG, action="store_true", help=DEBUG_HELP)
    plan.set_defaults(func=_cmd_plan)
    return parser


def _main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    return args.func(args)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hpse_easyedit edit ...``; user errors are one line on stderr and exit code 2 (see
    ``run_cli``)."""
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
