"""What each benchmark asks the edited model and how it scores the answers (paper appendix C).

A task turns one case into the questions to generate answers for, turns the answers into a JSON-able
per-case record with the case's scores, and averages the records into the benchmark's summary
numbers (in percent, like the paper's tables).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from .datasets import MQUAKE_FILE, UNKE_FILE, UNKE_SUBJECTS_FILE, load_mquake_uns, load_unkebench
from .judge import CoverageItem, Judge, JudgeError
from .metrics import diversity, mean, mquake_case_scores

__all__ = ["MQuAKEUns", "TASKS", "Task", "UnKEBench", "unjudged_metrics"]


def _pct(value: float | None) -> float | None:
    return None if value is None else 100.0 * value


def _data_path(data_dir: Path, file: str | Path) -> Path:
    return Path(file) if Path(file).is_absolute() else data_dir / file


class Task:
    """A benchmark: its data file and loader, its questions, generation limit, per-case scoring and summary,
    and whether it needs a judge and measures MMLU (locality) around each edit."""

    name: str
    title: str
    data_file: str
    file_option: str
    default_max_new_tokens: int
    metrics: tuple[str, ...]
    needs_judge: bool = False
    measures_mmlu: bool = False

    def data_path(self, data_dir: Path, file: str | None) -> Path:
        """The data file a run reads: ``file`` (the task's ``file_option``) or the default, relative to ``data_dir``."""
        return _data_path(data_dir, file or self.data_file)

    def load(self, data_dir: Path, opts: Any, client: Any, cache_dir: Path, template: str) -> tuple[Any, list[Path]]:
        """The cases (``opts``: a ``RunOptions``) and the input files their results depend on (hashed into config.json)."""
        raise NotImplementedError

    def run_config(self, opts: Any, judge: Judge | None, mmlu: bool) -> dict:
        """What this task adds to a run's config.json (the judge, the subjects, the MMLU subset)."""
        return {}

    def questions(self, case: Mapping[str, Any]) -> list[str]:
        raise NotImplementedError

    def score(self, case: Mapping[str, Any], answers: Sequence[str], judge: Judge | None) -> dict:
        raise NotImplementedError

    def summarize(self, records: Sequence[Mapping[str, Any]]) -> dict:
        """Mean of each metric over the records, in percent, plus ``Avg`` = mean of those metrics."""
        out: dict[str, float | None] = {m: _pct(mean(r[m] for r in records)) for m in self.metrics}
        out["Avg"] = mean(out[m] for m in self.metrics) if all(out[m] is not None for m in self.metrics) else None
        return out


class MQuAKEUns(Task):
    """Ind: mean over ``new_single_hops``; Cmp: any of the 3 multi-hop questions; official substring check."""

    name = "mquake-uns"
    title = "MQuAKE-uns"
    data_file = MQUAKE_FILE
    file_option = "--mquake-file"
    default_max_new_tokens = 128
    metrics = ("Ind", "Cmp")

    def load(self, data_dir: Path, opts: Any, client: Any, cache_dir: Path, template: str) -> tuple[Any, list[Path]]:
        file = opts.data_file or self.data_file
        cases = load_mquake_uns(data_dir, file=file, limit=opts.limit, client=client, cache_dir=cache_dir,
                                prompt_template=template)
        return cases, [_data_path(data_dir, file)]

    def questions(self, case: Mapping[str, Any]) -> list[str]:
        return list(case["single_hop_questions"]) + list(case["multi_hop_questions"])

    def score(self, case: Mapping[str, Any], answers: Sequence[str], judge: Judge | None = None) -> dict:
        n = len(case["single_hop_questions"])
        single, multi = list(answers[:n]), list(answers[n:])
        scores = mquake_case_scores(single, case["single_hop_answers"], multi, case["multi_hop_answers"])
        return {"answers": {"single_hop": single, "multi_hop": multi}, **scores}


class UnKEBench(Task):
    """Jnt: FActScore of the answers to ``question`` and ``para_question``; Dmp: judge per sub-question;
    Div: 1 - SelfBLEU-4 among the sub-question answers."""

    name = "unkebench"
    title = "UnKEBench"
    data_file = UNKE_FILE
    file_option = "--unke-file"
    default_max_new_tokens = 200
    metrics = ("Jnt", "Dmp", "Div")
    needs_judge = True
    measures_mmlu = True

    def load(self, data_dir: Path, opts: Any, client: Any, cache_dir: Path, template: str) -> tuple[Any, list[Path]]:
        file = opts.data_file or self.data_file
        subjects_file = Path(opts.subjects_file) if opts.subjects_file else data_dir / UNKE_SUBJECTS_FILE
        cases = load_unkebench(
            data_dir, file=file, limit=opts.limit, subjects=opts.subjects, subjects_file=subjects_file,
            client=client, cache_dir=cache_dir, prompt_template=template,
        )
        paths = [_data_path(data_dir, file)]
        if subjects_file.is_file() and opts.subjects in {"auto", "file"}:
            paths.append(subjects_file)
        return cases, paths

    def run_config(self, opts: Any, judge: Judge | None, mmlu: bool) -> dict:
        config: dict[str, Any] = {
            "judge": judge.name if judge else None,
            "subjects": opts.subjects,
            "mmlu": {"n": opts.mmlu_n, "shots": opts.mmlu_shots, "seed": opts.mmlu_seed} if mmlu else None,
        }
        if mmlu and opts.mmlu_every != 1:  # absent at 1, so run directories from before the option still match
            config["mmlu"]["every"] = opts.mmlu_every
        return config

    def questions(self, case: Mapping[str, Any]) -> list[str]:
        return [case["question"], case["para_question"], *case["sub_questions"]]

    def score(self, case: Mapping[str, Any], answers: Sequence[str], judge: Judge | None) -> dict:
        if judge is None:
            raise ValueError("UnKEBench needs a judge (an LLM endpoint or the lexical fallback)")
        joint, subs = list(answers[:2]), list(answers[2:])
        rec: dict[str, Any] = {
            "answers": {"question": joint[0], "para_question": joint[1], "sub_questions": subs},
            "Div": diversity(subs),
            "judge": judge.name,
        }
        facts = [judge.factscore(a, case["passage"], case["subject"]) for a in joint]
        items = [CoverageItem(q, e, a) for q, e, a in zip(case["sub_questions"], case["sub_answers"], subs)]
        dmp, dmp_complete = judge.coverage(items)
        jnt_complete = all(f.complete for f in facts)
        # An answer the judge could not judge is unjudged (None), never a 0; the next run judges it again.
        unjudged = [m for m, ok in (("Jnt", jnt_complete), ("Dmp", dmp_complete)) if not ok]
        rec.update(
            factscore=[f.to_dict() for f in facts],
            dmp_scores=dmp,
            Jnt=mean(f.score for f in facts) if jnt_complete else None,
            Dmp=mean(dmp) if dmp_complete else None,
            judge_complete=not unjudged,
        )
        if unjudged:
            rec["unjudged"] = unjudged
        return rec

    def unjudged_record(self, case: Mapping[str, Any], answers: Sequence[str], judge: Judge, error: JudgeError) -> dict:
        """The record of a case whose judge failed for good: the answers and Div kept, Jnt/Dmp unjudged (not 0)."""
        subs = list(answers[2:])
        return {
            "answers": {"question": answers[0], "para_question": answers[1], "sub_questions": subs},
            "Div": diversity(subs), "judge": judge.name, "factscore": None, "dmp_scores": None, "Jnt": None, "Dmp": None,
            "judge_complete": False, "unjudged": ["Jnt", "Dmp"], "judge_error": " ".join(str(error).split())[:300],
        }

    @staticmethod
    def answers_of(record: Mapping[str, Any]) -> list[str]:
        """A record's stored answers in ``questions`` order, to judge them again without generating anything."""
        a = record["answers"]
        return [a["question"], a["para_question"], *a["sub_questions"]]

    def summarize(self, records: Sequence[Mapping[str, Any]]) -> dict:
        out = super().summarize(records)
        out["judge_incomplete_cases"] = sum(not r.get("judge_complete", True) for r in records)
        out["unjudged_cases"] = sum(bool(unjudged_metrics(r)) for r in records)
        return out


def unjudged_metrics(record: Mapping[str, Any]) -> list[str]:
    """The judge metrics of a record that still need a judge (records written before ``unjudged`` existed
    count as unjudged when the judge did not finish them)."""
    if record.get("unjudged"):
        return list(record["unjudged"])
    return ["Jnt", "Dmp"] if record.get("judge_complete") is False else []


TASKS: dict[str, Task] = {t.name: t for t in (UnKEBench(), MQuAKEUns())}
