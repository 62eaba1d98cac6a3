"""What one benchmark run depends on, checked by pydantic before any file is read or model loaded.

``RunOptions`` holds the options every run shares; the options a task declares (``Task.options``,
e.g. UnKEBench's subjects and MMLU subset) are given by name like the others and kept in
``task_options``, so an MQuAKE-uns run has none of UnKEBench's. A bad value is one ``UsageError``
line naming the command-line option.
"""

from __future__ import annotations

from typing import Annotated, Any, Callable, Literal, Mapping

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    InstanceOf,
    ValidationError,
    create_model,
    model_validator,
)
from pydantic_core import PydanticCustomError

from hpse_easyedit.errors import UsageError, check_new_dir, choice_text

from ..tasks.judge import JUDGE_KINDS, JudgeSettings
from ..tasks.task import TASKS, Option, Task
from .distributed import DEFAULT_TIMEOUT

__all__ = ["RunOptions"]

#: field -> (command-line option, what the value means) for the range messages of the shared options
_RANGES = {
    "sequential": ("--sequential", "cases edited one after another"),
    "limit": ("--limit", "the first N cases"),
    "batch_size": ("--batch-size", "answers generated at once"),
    "cases_at_once": ("--cases-at-once", "independent cases edited together"),
    "sequences_at_once": ("--sequences-at-once", "continual sequences edited together"),
    "max_new_tokens": ("--max-answer-tokens", "answer length cap"),
    "max_attempts": ("--judge-max-attempts", "requests per judge question"),
    "dist_timeout_hours": ("--dist-timeout-hours", ""),
    "timeout": ("--judge-timeout", ""),
}


def _one_of(flag: str, choices: Any) -> Callable[[Any], Any]:
    """A check against a registry's live list (a judge or subject mode registered later is
    accepted)."""

    def check(value: Any) -> Any:
        if value not in choices:
            raise PydanticCustomError(
                "choice",
                "{line}",
                {"line": f"{flag} must be {choice_text(choices)}, got {value!r}"},
            )
        return value

    return check


def _cases_at_once(value: Any) -> Any:
    """``--cases-at-once``: a whole number >= 1, or 'auto' (the runner resolves it: the memory
    planner's largest B on a GPU, a fixed number on CPU)."""
    if isinstance(value, str):
        text = value.strip().lower()
        value = int(text) if text.isdigit() else "auto" if text == "auto" else value
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    flag, what = _RANGES["cases_at_once"]
    raise PydanticCustomError(
        "choice", "{line}", {"line": f"{flag} must be >= 1 ({what}) or auto, got {value!r}"}
    )


def _task_model(task: Task) -> type[BaseModel]:
    """The pydantic model of a task's declared options: ranges, registry choices, no other key."""
    fields: dict[str, Any] = {}
    for o in task.options:
        # a type, or a converter function: then whatever it returns
        annotation: Any = o.type | None if isinstance(o.type, type) else Any
        if o.choices is not None:
            annotation = Annotated[annotation, AfterValidator(_one_of(o.flag, o.choices))]
        fields[o.name] = (annotation, Field(o.default, ge=o.minimum))
    return create_model(
        f"{type(task).__name__}Options", __config__=ConfigDict(extra="forbid"), **fields
    )


def _judge_settings_ranges(settings: JudgeSettings) -> None:
    """The judge request settings' ranges (``JudgeSettings`` is the judge's own dataclass)."""
    _JudgeRanges.model_validate(
        {"max_attempts": settings.max_attempts, "timeout": settings.timeout}
    )


class _JudgeRanges(BaseModel):
    max_attempts: Annotated[int, Field(ge=1)]
    timeout: Annotated[float, Field(gt=0)]


class RunOptions(BaseModel):
    """Everything one benchmark run depends on (``benchmarks.run.cli.add_run_arguments`` says what
    each means)."""

    model_config = ConfigDict(extra="forbid")

    benchmark: str
    hparams: str
    overrides: list[str] = Field(default_factory=list)
    data_dir: str | None = None
    out_dir: str | None = None
    label: str | None = None
    sequential: Annotated[int | None, Field(ge=1)] = None
    limit: Annotated[int | None, Field(ge=1)] = None
    cases: list[str] | None = None
    checkpoints: list[int] | None = None
    batch_size: Annotated[int, Field(ge=1)] = 8
    #: 'auto' until ``benchmarks.run.runner`` resolves it
    cases_at_once: Annotated[int | Literal["auto"], BeforeValidator(_cases_at_once)] = 1
    sequences_at_once: Annotated[int, Field(ge=1)] = 1
    max_new_tokens: Annotated[int | None, Field(ge=1)] = None
    data_file: str | None = None
    judge: str = "auto"
    judge_settings: InstanceOf[JudgeSettings] = Field(default_factory=JudgeSettings)
    cache_dir: str | None = None
    dist_timeout_hours: Annotated[float, Field(gt=0)] = DEFAULT_TIMEOUT.total_seconds() / 3600
    store_rollouts: bool = True
    retry_failed: bool = False
    #: the values of the task's declared options (``Task.options``), defaults filled in
    task_options: dict[str, Any] = Field(default_factory=dict)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as err:
            raise UsageError(_one_line(err)) from None

    @model_validator(mode="before")
    @classmethod
    def _gather_task_options(cls, data: Any) -> Any:
        """The task's options, given by name beside the shared ones, into ``task_options`` (checked
        there)."""
        if not isinstance(data, Mapping):
            return data
        task = TASKS.get(data.get("benchmark"))
        if task is None:
            raise UsageError(
                f"benchmark must be one of {sorted(TASKS)}, got {data.get('benchmark')!r}"
            )
        own = {o.name for o in task.options}
        given = {**data.get("task_options", {}), **{k: v for k, v in data.items() if k in own}}
        shared = {k: v for k, v in data.items() if k not in own}
        return {**shared, "task_options": given}

    @model_validator(mode="after")
    def _check(self) -> RunOptions:
        """The judge's ranges, the task's options, then what one field alone cannot say."""
        try:
            self.task_options = (
                _task_model(TASKS[self.benchmark]).model_validate(self.task_options).model_dump()
            )
            _judge_settings_ranges(self.judge_settings)
        except ValidationError as err:
            raise UsageError(_one_line(err)) from None
        if self.cases is not None:
            self.cases = [str(c).strip() for c in self.cases if str(c).strip()]
            if not self.cases:
                raise UsageError(
                    "--cases names no case id; give comma-separated ids, e.g. --cases 6,24,68"
                )
            if self.sequential:
                raise UsageError(
                    "--cases picks single cases; continual editing (--sequential) edits "
                    "consecutive cases, so use --limit there"
                )
        if self.cases_at_once != 1 and self.sequential:
            raise UsageError(
                "--cases-at-once edits independent single cases together; a continual sequence's "
                "edits depend on each other, so drop --cases-at-once with --sequential"
            )
        if self.sequences_at_once > 1 and not self.sequential:
            raise UsageError(
                "--sequences-at-once runs continual sequences side by side; give --sequential T "
                "with it (single editing takes --cases-at-once)"
            )
        if self.checkpoints is not None:
            if not self.sequential:
                raise UsageError(
                    "--checkpoints evaluates a continual sequence "
                    "part-way; give --sequential T with it"
                )
            bad = [c for c in self.checkpoints if not 1 <= c < self.sequential]
            if bad or not self.checkpoints:
                raise UsageError(
                    f"--checkpoints must be edit counts from 1 to {self.sequential - 1} (T itself "
                    "is always evaluated), e.g. 10,20,50 with "
                    f"--sequential 100; got {bad or 'none'}"
                )
            self.checkpoints = sorted(set(self.checkpoints))
        _one_of("--judge", JUDGE_KINDS)(self.judge)
        check_new_dir("--out", self.out_dir, may_hold_files=True)
        check_new_dir("--cache-dir", self.cache_dir, may_hold_files=True)
        return self


def _flag(loc: tuple, options: Mapping[str, Option]) -> tuple[str, str]:
    """The command-line option a validation error's location names, and what its value means."""
    name = str(loc[-1])
    if name in options:
        return options[name].flag, options[name].what
    return _RANGES.get(name, (f"--{name.replace('_', '-')}", ""))


def _one_line(err: ValidationError) -> str:
    """The first error as the line the command line has always printed for it."""
    first = err.errors(include_url=False)[0]
    if first["type"] == "value_error" and isinstance(first.get("ctx", {}).get("error"), UsageError):
        return str(first["ctx"]["error"])
    if first["type"] == "choice":
        return first["ctx"]["line"]
    if first["type"] == "extra_forbidden":
        return (
            f"{first['loc'][-1]!r} is no option of this "
            "run (the task declares its own: Task.options)"
        )
    options = {o.name: o for task in TASKS.values() for o in task.options}
    flag, what = _flag(first["loc"], options)
    value = first["input"]
    if first["type"] == "greater_than_equal":
        return f"{flag} must be >= {first['ctx']['ge']} ({what}), got {value}"
    if first["type"] == "greater_than":
        return f"{flag} must be > {first['ctx']['gt']:g}, got {value}"
    return f"{flag}: {first['msg']}, got {value!r}"
