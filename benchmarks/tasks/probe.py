"""The locality check around a run's edits, as the case loops call it (``LocalityProbe``), and the
probe of a task that has none (``NoProbe``). ``benchmarks.tasks.mmlu.MMLUProbe`` is the one
measuring probe; a task names its probe in ``Task.locality_probe``."""

from __future__ import annotations

from typing import Any, Callable, Protocol

__all__ = ["LocalityProbe", "NoProbe"]


class LocalityProbe(Protocol):
    """What the runner and the case loops ask of a locality check, in this order: ``load`` its
    items (once per run), ``lacks_before`` (must the unedited model be loaded to measure it?),
    ``before`` (the unedited model's score, measured once per run directory), then after each edit
    unit (a case in single mode, a block in continual mode) ``due`` and, when due, ``measure``; a
    continual run's checkpoint measures whenever the probe is ``enabled``."""

    #: whether it measures anything at all (recorded in config.json; checkpoints measure then)
    enabled: bool

    def load(self) -> None: ...

    def lacks_before(self) -> bool: ...

    def before(self, unedited: Callable[[], tuple[Any, Any]] | None) -> float | None:
        """The unedited model's score; ``unedited()`` gives that model and its tokenizer (None:
        it must be recorded already, by the main process)."""
        ...

    def due(self, unit: int) -> bool: ...

    def measure(self, model: Any, tokenizer: Any) -> float: ...


class NoProbe:
    """The locality check of a task that has none: nothing to load or measure, nothing recorded."""

    enabled = False

    def load(self) -> None:
        pass

    def lacks_before(self) -> bool:
        return False

    def due(self, unit: int) -> bool:
        return False

    def before(self, unedited: Callable[[], tuple[Any, Any]] | None) -> None:
        return None

    def measure(self, model: Any, tokenizer: Any) -> float:
        raise RuntimeError("NoProbe measures nothing; ask due() or enabled first")
