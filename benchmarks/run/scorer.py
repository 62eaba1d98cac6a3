"""The scores of a benchmark run's cases: the task's scoring with the judge it needs, and the
judge's gaps.

A case the judge cannot judge for good keeps its answers with its judge metrics unjudged (never 0);
a rerun judges such recorded cases again from their stored answers (``rejudge``) without editing
anything. A refused request (an unknown judge model, say) stops the run once the case in hand is
written.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..records.store import ResultFile
from ..tasks.judge import (
    LEXICAL_JUDGE_NAME,
    ChatClient,
    Judge,
    JudgeError,
    JudgeRefusedError,
    JudgeSettings,
    LLMJudge,
    make_judge,
)
from ..tasks.paths import JUDGE_CACHE
from ..tasks.task import Task, unjudged_metrics

__all__ = ["Scorer"]

log = logging.getLogger(__name__)


class Scorer:
    """The task's scoring with its judge (None for a task that needs none), and the chat client data
    loading may use (generated passages for MQuAKE files that have none)."""

    def __init__(self, task: Task, kind: str, settings: JudgeSettings, cache_dir: Path) -> None:
        self.task = task
        self.kind = kind
        settings = JudgeSettings(
            **{**settings.__dict__, "cache_path": str(cache_dir / JUDGE_CACHE)}
        )
        self.judge: Judge | None = (
            make_judge(kind, settings, warn=False) if task.needs_judge else None
        )
        self.client: ChatClient | None = (
            self.judge.client if isinstance(self.judge, LLMJudge) else None
        )
        if (
            self.client is None
            and not task.needs_judge
            and kind != "lexical"
            and settings.resolve().configured
        ):
            self.client = ChatClient(settings)
        self.refused: JudgeRefusedError | None = None

    def probe(self) -> None:
        """One cheap request to the judge endpoint before the first edit (``JudgeError`` when it is
        not there)."""
        if self.client is not None:
            self.client.probe()
            log.info(
                "judge: %s at %s",
                self.client.name,
                self.client.settings.base_url or "the OpenAI default URL",
            )
        if self.judge is not None and self.judge.name == LEXICAL_JUDGE_NAME and self.kind == "auto":
            log.warning(
                "no judge endpoint configured (--judge-base-url / HPSE_JUDGE_BASE_URL / "
                "OPENAI_BASE_URL or an API key): scoring UnKEBench with the offline LEXICAL "
                "FALLBACK judge; its Jnt/Dmp are not the paper's"
            )

    def score(self, case: Mapping[str, Any], answers: Sequence[str]) -> dict:
        """The case's scores; when the judge fails for good the answers are kept and Jnt/Dmp stored
        unjudged (a refused request, e.g. an unknown judge model, stops the run once this case is
        written)."""
        try:
            return self.task.score(case, answers, self.judge)
        except JudgeError as err:
            log.warning(
                "case %s: the judge failed (%s); its answers are kept and judged by the next run",
                case["case_id"],
                " ".join(str(err).split())[:200],
            )
            if isinstance(err, JudgeRefusedError):
                self.refused = err
            return self.task.unjudged_record(case, answers, self.judge, err)

    def stop_if_refused(self) -> None:
        if self.refused is not None:
            raise self.refused

    def rejudge(self, results: ResultFile, cases: Any, ids: list[str]) -> None:
        """Judge again, from their stored answers, this process's recorded cases the judge could not
        judge before."""
        if self.judge is None:
            return
        index = {cid: i for i, cid in enumerate(ids)}
        pending = [r for cid, r in results.records.items() if cid in index and unjudged_metrics(r)]
        if not pending:
            return
        log.info(
            "judging %d recorded case(s) again that the judge could not judge before (no new edit)",
            len(pending),
        )
        redone = []
        for rec in pending:
            case = cases[index[str(rec["case_id"])]]
            scores = self.score(case, self.task.answers_of(rec))
            new = {k: v for k, v in rec.items() if k not in ("unjudged", "judge_error")}
            new.update(scores)
            redone.append(new)
        results.replace(redone)
        self.stop_if_refused()
        left = sum(bool(unjudged_metrics(r)) for r in redone)
        log.info(
            "%d of %d judged now%s",
            len(redone) - left,
            len(redone),
            f"; {left} still unjudged" if left else "",
        )

    def close(self) -> None:
        """Release the judge endpoint and its cache."""
        if self.judge is not None:
            self.judge.close()
        elif self.client is not None:
            self.client.close()
