"""Which share of a benchmark run this process does, and where its model goes, from accelerate's
process state.

Under ``accelerate launch --num_processes N`` (or ``torchrun``) every process runs the same script.
``process_context`` asks accelerate's ``PartialState`` which process this is and gives back a
``ProcessContext``: its rank, the number of processes, the device its model goes to, and the
barriers the runner needs (``wait_for_everyone``, main process first). Without a launcher it is the
single process of today's runs, and nothing changes.

Devices. Without ``model_parallel`` process R uses accelerate's device for it (``cuda:LOCAL_RANK``,
or the CPU under ``--cpu`` / on a machine without GPUs), which overrides the hparams' ``device``.
With ``model_parallel: true`` and several processes, each process owns a group of k GPUs of its
host: the host's visible GPUs are split into equal contiguous groups, one per local process (8 GPUs
and 4 processes per host: process 0 gets GPUs 0,1, process 1 gets 2,3, ...), set as
``CUDA_VISIBLE_DEVICES`` of that process before CUDA starts, and ``device_map="auto"`` spreads the
model over that group. The processes then synchronise over gloo (CPU), since no process owns a
single GPU for NCCL. With one process, ``model_parallel`` uses every visible GPU, as before.

Launcher variables left over from another launch (``RANK=3 WORLD_SIZE=2``, or ``RANK=1
WORLD_SIZE=2`` without ``MASTER_ADDR``) are one ``LaunchError`` line before anything starts, and the
start of the process group (every process reaching the rendezvous) is bounded by
``$HPSE_DIST_START_TIMEOUT`` seconds (default 600): a process whose peers never come says so in one
line and exits with code 2 instead of waiting for days.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterator, Sequence, TypeVar

__all__ = [
    "DEFAULT_START_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "LaunchError",
    "ProcessContext",
    "check_launch_environment",
    "current_context",
    "gpu_group",
    "process_context",
    "start_timeout",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: How long a process waits at a barrier for the others. Shards are uneven (a continual-editing run
#: of 4 blocks on 8 processes leaves 4 idle from the start), so this must outlast the longest shard;
#: a process that crashes is torn down by the launcher together with the others, so only a hung
#: process is ever waited for this long.
DEFAULT_TIMEOUT = timedelta(days=7)

#: How long a process waits for the others of its launch to reach the rendezvous that starts the
#: process group (``$HPSE_DIST_START_TIMEOUT`` seconds). The processes of a launch start together
#: and reach it before any model loads; only variables left over from another launch, or peers that
#: died before it, make a process wait this long.
DEFAULT_START_TIMEOUT = 600.0

_CONTEXT: "ProcessContext | None" = None


class LaunchError(RuntimeError):
    """The processes of a launch cannot be set up as asked (GPU groups, model_parallel, process
    group)."""


@dataclass(frozen=True)
class ProcessContext:
    """This process's place in a (possibly multi-process) benchmark run.

    Attributes:
        rank, world: this process is ``rank`` of ``world`` processes (0 of 1 without a launcher).
        device: the hparams ``device`` this process must use (a CUDA index, or ``"cpu"``), or None
            to keep the hparams file's (single process, or ``model_parallel``).
        gpus: under ``model_parallel`` with several processes, the GPU ids this process owns.
        model_parallel: whether the context was made for ``model_parallel`` models.
        state: accelerate's ``PartialState``; None means no process group, and the barriers do
            nothing (one process, or the shards of an N-process layout run one after another by
            hand).
    """

    rank: int = 0
    world: int = 1
    device: int | str | None = None
    gpus: tuple[str, ...] | None = None
    model_parallel: bool = False
    state: Any = None

    def __post_init__(self) -> None:
        if self.world < 1 or not 0 <= self.rank < self.world:
            raise ValueError(
                f"rank must be in [0, world) and world >= 1, got rank {self.rank} of {self.world}"
            )

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def describe(self) -> str:
        """'process 2 of 8 (cuda:2)' for logs."""
        where = (
            f"GPUs {','.join(self.gpus)}"
            if self.gpus
            else (
                f"cuda:{self.device}"
                if isinstance(self.device, int)
                else self.device or "device from the hparams"
            )
        )
        return f"process {self.rank} of {self.world} ({where})"

    def shard(self, units: Sequence[T]) -> list[T]:
        """This process's units: every ``world``-th one starting at ``rank``.

        Depends only on a unit's position, not on how many there are, so raising ``--limit`` never
        moves a unit to another process.
        """
        return list(units[self.rank :: self.world])

    def barrier(self) -> None:
        """Wait until every process got here (accelerate's ``wait_for_everyone``)."""
        if self.state is not None and self.world > 1:
            self.state.wait_for_everyone()

    @contextlib.contextmanager
    def main_first(self) -> Iterator[None]:
        """The main process runs the block first; the others run it once it is done."""
        if self.state is not None and self.world > 1:
            with self.state.main_process_first():
                yield
        else:
            yield


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.strip().isdigit() else default


def gpu_group(visible: Sequence[str], local_rank: int, local_world: int) -> list[str]:
    """The contiguous share of a host's ``visible`` GPU ids that local process ``local_rank`` of
    ``local_world`` owns."""
    if not visible:
        raise LaunchError(
            "model_parallel with several processes needs GPUs, but none is visible on this host"
        )
    k, rest = divmod(len(visible), local_world)
    if k == 0 or rest:
        raise LaunchError(
            f"model_parallel: the {len(visible)} visible GPU(s) of this host cannot be split "
            f"evenly among its {local_world} processes; launch a number of processes per host "
            "that divides the GPUs (8 GPUs: --num_processes "
            "8, 4 or 2 per host for 1, 2 or 4 GPUs per model)"
        )
    return list(visible[local_rank * k : (local_rank + 1) * k])


def _claim_gpu_group() -> tuple[str, ...]:
    """Limit this process to its GPU group (``CUDA_VISIBLE_DEVICES``) before CUDA starts."""
    import torch

    if torch.cuda.is_initialized():
        raise LaunchError(
            "model_parallel with several processes: CUDA was already started in this process, so "
            "it can no longer be limited to its own GPUs; run the "
            "benchmark scripts directly under accelerate launch"
        )
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    # Before CUDA starts, torch counts GPUs through NVML, which does not pin the visible set.
    visible = (
        [s.strip() for s in env.split(",") if s.strip()]
        if env is not None
        else [str(i) for i in range(torch.cuda.device_count())]
    )
    group = gpu_group(visible, _env_int("LOCAL_RANK", 0), _env_int("LOCAL_WORLD_SIZE", 1))
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(group)
    torch.cuda.init()  # the driver reads CUDA_VISIBLE_DEVICES once; see whether it still could
    if torch.cuda.device_count() != len(group):
        raise LaunchError(
            f"model_parallel: this process was limited to GPUs {group} but CUDA still sees "
            f"{torch.cuda.device_count()}; something queried CUDA in this process before the "
            "runner could set the limit (e.g. torch.cuda.is_available() while importing a "
            "method's code). Give each process its GPUs yourself, or use one process per host"
        )
    return tuple(group)


_LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
_STALE = (
    "launcher variables left over from another launch? Unset RANK, WORLD_SIZE, LOCAL_RANK, "
    "MASTER_ADDR and MASTER_PORT to run one process, or start the processes with `accelerate "
    "launch --num_processes N` or torchrun"
)


def check_launch_environment(env: os._Environ | dict | None = None) -> None:
    """``LaunchError`` for launcher variables no live launch can have set: a non-number, a rank not
    below ``WORLD_SIZE``, or several processes without ``MASTER_ADDR`` (where they meet)."""
    env = os.environ if env is None else env
    values = {}
    for name in _LAUNCH_VARIABLES:
        raw = str(env.get(name, "")).strip()
        if not raw:
            continue
        if not raw.isdigit():
            raise LaunchError(f"{name}={raw!r} is not a process count or index; {_STALE}")
        values[name] = int(raw)
    world, rank = values.get("WORLD_SIZE", 1), values.get("RANK", 0)
    if world < 1 or rank >= world:
        raise LaunchError(
            f"RANK={rank} but WORLD_SIZE={world}: a process's rank must be below the number of "
            f"processes; {_STALE}"
        )
    local_world = values.get("LOCAL_WORLD_SIZE", 1)
    if values.get("LOCAL_RANK", 0) >= max(local_world, 1) and "LOCAL_WORLD_SIZE" in values:
        raise LaunchError(
            f"LOCAL_RANK={values['LOCAL_RANK']} but LOCAL_WORLD_SIZE={local_world}; {_STALE}"
        )
    if world > 1 and not str(env.get("MASTER_ADDR", "")).strip():
        raise LaunchError(
            f"RANK={rank} and WORLD_SIZE={world} are set but MASTER_ADDR (where the processes "
            f"meet) is not; {_STALE}"
        )


def start_timeout() -> float:
    """``$HPSE_DIST_START_TIMEOUT`` in seconds, else ``DEFAULT_START_TIMEOUT``."""
    raw = os.environ.get("HPSE_DIST_START_TIMEOUT", "").strip()
    try:
        seconds = float(raw) if raw else DEFAULT_START_TIMEOUT
    except ValueError:
        raise LaunchError(
            f"HPSE_DIST_START_TIMEOUT={raw!r} is not a number of seconds; unset it or give one"
        ) from None
    if not seconds > 0:
        raise LaunchError(f"HPSE_DIST_START_TIMEOUT={raw!r} must be > 0 seconds")
    return seconds


@contextlib.contextmanager
def _bounded_start(seconds: float, rank: int, world: int) -> Iterator[None]:
    """Inside: the process-group rendezvous, which waits in C++ where no exception reaches it; if
    it lasts ``seconds``, one line on stderr and exit code 2 (nothing of the run is written yet)."""

    def give_up() -> None:
        where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT', '29500')}"
        sys.stderr.write(
            f"error: process {rank} of {world} waited {seconds:g} s at {where} for the other "
            f"processes of its launch and they did not all come ({_STALE}; or raise "
            "HPSE_DIST_START_TIMEOUT if they start slowly)\n"
        )
        sys.stderr.flush()
        os._exit(2)

    timer = threading.Timer(seconds, give_up)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def current_context() -> ProcessContext | None:
    """The context ``process_context`` made in this process, or None before the first run."""
    return _CONTEXT


def process_context(
    model_parallel: bool = False, timeout: timedelta = DEFAULT_TIMEOUT
) -> ProcessContext:
    """This process's ``ProcessContext``, made once per process from accelerate's ``PartialState``.

    ``model_parallel`` decides how GPUs are shared out, which can only happen before CUDA starts:
    all runs of one multi-process launch (all methods of ``run_compare.py``) must agree on it.
    """
    global _CONTEXT
    if _CONTEXT is not None:
        if _CONTEXT.world > 1 and _CONTEXT.model_parallel != model_parallel:
            raise LaunchError(
                f"model_parallel is {model_parallel} here but {_CONTEXT.model_parallel} for an "
                f"earlier run of this {_CONTEXT.world}-process launch; GPUs are shared out once "
                "per launch, so give every method the same model_parallel (--set "
                "model_parallel=...) or launch them separately"
            )
        return _CONTEXT
    check_launch_environment()
    launched = _env_int("WORLD_SIZE", 1)
    gpus = _claim_gpu_group() if model_parallel and launched > 1 else None

    import torch
    from accelerate import PartialState
    from accelerate.utils import parse_flag_from_env

    # gloo when there is no GPU (torchrun or accelerate launch on a CPU machine), when asked for
    # (--cpu), and under model_parallel, where no process owns a single GPU for NCCL.
    cpu = (
        gpus is not None
        or parse_flag_from_env("ACCELERATE_USE_CPU")
        or not torch.cuda.is_available()
    )
    seconds = min(start_timeout(), timeout.total_seconds())
    try:
        with _bounded_start(seconds, _env_int("RANK", 0), launched):
            state = PartialState(cpu=cpu, timeout=timeout)
    except (ValueError, RuntimeError) as err:  # accelerate's and torch's rendezvous errors
        if launched <= 1:
            raise
        raise LaunchError(
            f"the process group of this {launched}-process launch could not start "
            f"({' '.join(str(err).split())[:200]}); {_STALE}"
        ) from None
    if state.num_processes != launched and launched > 1:
        raise LaunchError(
            f"the launcher started {launched} processes (WORLD_SIZE) but accelerate's process "
            f"group has {state.num_processes}; launch with "
            "`accelerate launch --num_processes N` or torchrun"
        )
    device: int | str | None = None
    if state.num_processes > 1 and not model_parallel:
        d = state.device
        device = (
            d.index
            if d.type == "cuda" and d.index is not None
            else ("cpu" if d.type == "cpu" else str(d))
        )
    _CONTEXT = ProcessContext(
        rank=state.process_index,
        world=state.num_processes,
        device=device,
        gpus=gpus,
        model_parallel=model_parallel,
        state=state if state.num_processes > 1 else None,
    )
    if _CONTEXT.world > 1:
        log.info("%s", _CONTEXT.describe())
    return _CONTEXT
