"""What each benchmark asks the edited model and how it scores the answers (paper appendix C).

A task turns one case into the questions to generate answers for, turns the answers into a JSON-able
per-case record with the case's scores, and averages the records into the benchmark's summary
numbers (in percent, like the paper's tables).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .datasets import (
    MQUAKE_FILE,
    SUBJECT_MODES,
    UNKE_FILE,
    UNKE_SUBJECTS_FILE,
    load_mquake_uns,
    load_unkebench,
)
from .judge import LEXICAL_JUDGE_NAME, CoverageItem, Judge, JudgeError, LexicalJudge
from .metrics import diversity, mean, mquake_case_scores
from .probe import LocalityProbe, NoProbe
from .unke_scores import KEY as UNKE_METRICS
from .unke_scores import record_metrics, summarize_metrics

__all__ = [
    "MQuAKEUns",
    "Option",
    "Question",
    "TASKS",
    "Task",
    "UnKEBench",
    "composition_given_hops",
    "data_path",
    "unjudged_metrics",
]

Cut = Callable[[str], str]


def _pct(value: float | None) -> float | None:
    return None if value is None else 100.0 * value


def data_path(data_dir: Path, file: str | Path) -> Path:
    """A data file named on the command line: as given when absolute, else relative to
    ``data_dir``."""
    return Path(file) if Path(file).is_absolute() else data_dir / file


@dataclass(frozen=True)
class Option:
    """One option a task declares: ``benchmarks.run.cli`` adds it to the command line (``cli``),
    ``RunOptions`` checks it (``minimum``, ``choices``: a live registry list, ``must_exist``: a file
    the value names) and keeps its value in ``RunOptions.task_options[name]``, where the task's
    ``load`` and ``run_config`` read it."""

    name: str
    flag: str
    default: Any
    help: str = ""
    type: Callable[[str], Any] | None = None
    minimum: int | None = None
    #: what the value means, in the one-line range message (``--mmlu-n must be >= 0 (0 skips MMLU),
    #: got -1``)
    what: str = ""
    choices: Sequence[str] | None = None
    metavar: str | None = None
    #: the fix a one-line message gives when the file the value names does not exist ("" for no file
    #: check)
    must_exist: str = ""
    cli: bool = True


@dataclass(frozen=True)
class Question:
    """One question of a case as the reports show it: where its answer is kept in a record and how
    it is checked.

    ``key`` (and ``index`` for a list) locate the answer in ``record["answers"]``. ``expected``: the
    gold answer and its aliases (None: judged against the passage). ``check``: ``"alias"`` (the
    official substring check against ``expected``), ``"coverage"`` (the judge's verdict,
    ``record["dmp_scores"][index]``) or ``"facts"`` (the judge's FActScore facts,
    ``record["factscore"][facts]``). ``in_case_studies``: shown by ``benchmarks.analysis.paired
    --show`` too (the HTML report shows every question).
    """

    kind: str
    text: str
    expected: tuple[str, ...] | None
    key: str
    index: int | None = None
    check: str = "alias"
    facts: int | None = None
    in_case_studies: bool = True

    def answer(self, record: Mapping[str, Any] | None) -> str:
        """This question's answer in ``record`` ('' when the record keeps none)."""
        stored = (record or {}).get("answers") or {}
        if self.index is None:
            return stored.get(self.key, "")
        return ((stored.get(self.key) or [])[self.index : self.index + 1] or [""])[0]


class Task:
    """A benchmark: its data file and loader, its declared options, its questions, generation limit,
    per-case scoring, record shape and summary, whether it needs a judge and measures MMLU
    (locality) around each edit, its columns in the paper's table, and how the offline reports load
    its cases and rescore stored answers."""

    name: str
    title: str
    data_file: str
    #: the command-line option that names another data file (its value is ``RunOptions.data_file``)
    data_option: Option
    default_max_new_tokens: int
    metrics: tuple[str, ...]
    #: (header label, summary key) of the task's columns in the paper's table, in the paper's order
    table_columns: tuple[tuple[str, str], ...]
    needs_judge: bool = False
    measures_mmlu: bool = False
    #: ``benchmarks.analysis.paired --whole-word-aliases`` can rescore this task's answers (an alias
    # check to
    #: make stricter)
    rescores_aliases: bool = False
    #: a line under the recitation table saying how this task's cut answers are rescored ("" for
    #: none)
    recitation_note: str = ""
    #: the task's own options (the command line offers them, ``RunOptions.task_options`` holds their
    #: values)
    options: tuple[Option, ...] = ()

    def load(
        self, data_dir: Path, opts: Any, client: Any, cache_dir: Path, template: str
    ) -> tuple[Any, list[Path]]:
        """The cases, a ``datasets.Dataset`` with a ``case_id`` and a ``requests`` column (``opts``:
        a ``RunOptions``), and the input files their results depend on (hashed into config.json)."""
        raise NotImplementedError

    def load_cases(
        self,
        data_dir: str | Path,
        file: str | Path | None = None,
        *,
        limit: int | None = None,
        subjects: str = "heuristic",
    ) -> list[dict]:
        """The cases of ``file`` (default: the task's data file) under ``data_dir``, offline (no
        judge, no model), for the reports: ``benchmarks.analysis.paired``,
        ``benchmarks.report.html``, ``benchmarks.analysis.inspect_rollout``. ``subjects``: how a
        task with subject phrases finds them (``datasets.load_unkebench``)."""
        raise NotImplementedError

    def rescore(
        self,
        records: Mapping[str, Mapping],
        cases: Mapping[str, Mapping],
        *,
        cut: Cut | None = None,
        whole_word_max: int = 0,
    ) -> Mapping[str, Mapping]:
        """``records`` (case id -> record) rescored from their stored answers, each cut by ``cut``
        first, with ``whole_word_max`` for a task that ``rescores_aliases``; ``records`` themselves
        when nothing changes them. ``cases``: case id -> loaded case (``load_cases``)."""
        return records

    def composition(self, records: Sequence[Mapping[str, Any]]) -> dict[str, int] | None:
        """A count ``benchmarks.analysis.paired`` adds under the table for this task (MQuAKE-uns:
        composition given the hops), or None."""
        return None

    def case_questions(self, case: Mapping[str, Any]) -> list[Question]:
        """Every question of a case as the reports show it, in the order they list them."""
        raise NotImplementedError

    def partial_summary(self, records: Sequence[Mapping[str, Any]]) -> dict:
        """The summary of the records there are (a run whose summary.json is not written yet), with
        the table's extra keys (MMLU, judge) for a task that has them."""
        out = self.summarize(records)
        if self.measures_mmlu:
            out["MMLU_after"] = mean(r.get("MMLU_after") for r in records)
        if self.needs_judge:
            out["judge"] = next((r.get("judge") for r in records if r.get("judge")), None)
        return out

    def run_config(self, options: Mapping[str, Any], judge: Judge | None, mmlu: bool) -> dict:
        """What this task adds to a run's config.json (the judge, the subjects, the MMLU subset);
        ``options``: the values of its declared options."""
        return {}

    def locality_probe(
        self, options: Mapping[str, Any], data_dir: Path, out_dir: Path
    ) -> LocalityProbe:
        """The locality check around this task's edits: MMLU for a task that ``measures_mmlu``
        (with ``mmlu_n`` > 0 questions), none otherwise."""
        if self.measures_mmlu and options["mmlu_n"] > 0:
            from .mmlu import MMLUProbe  # only a task that measures MMLU loads the MMLU code

            return MMLUProbe(options, data_dir, out_dir)
        return NoProbe()

    def questions(self, case: Mapping[str, Any]) -> list[str]:
        raise NotImplementedError

    def score(self, case: Mapping[str, Any], answers: Sequence[str], judge: Judge | None) -> dict:
        """The case's record: its answers (in the task's record shape) and its scores."""
        raise NotImplementedError

    def answers_of(self, record: Mapping[str, Any]) -> list[str]:
        """A record's stored answers in ``questions`` order, to score them again without generating
        anything."""
        raise NotImplementedError

    def unjudged_record(
        self, case: Mapping[str, Any], answers: Sequence[str], judge: Judge, error: JudgeError
    ) -> dict:
        """The record of a case whose judge failed for good (a task that ``needs_judge``); a task
        without a judge never meets a judge error, so it raises it again."""
        raise error

    def summarize(self, records: Sequence[Mapping[str, Any]]) -> dict:
        """Mean of each metric over the records, in percent, plus ``Avg`` = mean of those
        metrics."""
        out: dict[str, float | None] = {m: _pct(mean(r[m] for r in records)) for m in self.metrics}
        out["Avg"] = (
            mean(out[m] for m in self.metrics)
            if all(out[m] is not None for m in self.metrics)
            else None
        )
        return out


class MQuAKEUns(Task):
    """Ind: mean over ``new_single_hops``; Cmp: any of the 3 multi-hop questions; official substring
    check."""

    name = "mquake-uns"
    title = "MQuAKE-uns"
    data_file = MQUAKE_FILE
    default_max_new_tokens = 128
    metrics = ("Ind", "Cmp")
    table_columns = (("Ind", "Ind"), ("Cmp", "Cmp"), ("Avg", "Avg"))
    rescores_aliases = True
    #: the data file option's help text (``benchmarks.run.cli`` puts it in the task's group)
    data_option = Option(
        "data_file",
        "--mquake-file",
        None,
        metavar="FILE",
        help=f"MQuAKE file, relative to --data "
        f"(default {MQUAKE_FILE}; CF-3k/Remastered files get generated passages)",
    )

    def load(
        self, data_dir: Path, opts: Any, client: Any, cache_dir: Path, template: str
    ) -> tuple[Any, list[Path]]:
        file = opts.data_file or self.data_file
        cases = load_mquake_uns(
            data_dir,
            file=file,
            limit=opts.limit,
            client=client,
            cache_dir=cache_dir,
            prompt_template=template,
        )
        return cases, [data_path(data_dir, file)]

    def load_cases(
        self,
        data_dir: str | Path,
        file: str | Path | None = None,
        *,
        limit: int | None = None,
        subjects: str = "heuristic",
    ) -> list[dict]:
        return load_mquake_uns(data_dir, file=file or self.data_file, limit=limit)

    def questions(self, case: Mapping[str, Any]) -> list[str]:
        return list(case["single_hop_questions"]) + list(case["multi_hop_questions"])

    def case_questions(self, case: Mapping[str, Any]) -> list[Question]:
        single = [
            Question("single hop", q, tuple(g), "single_hop", i)
            for i, (q, g) in enumerate(
                zip(case["single_hop_questions"], case["single_hop_answers"])
            )
        ]
        # the multi-hop questions share one answer list: new_answer + new_answer_alias
        multi = [
            Question("multi-hop", q, tuple(case["multi_hop_answers"]), "multi_hop", i)
            for i, q in enumerate(case["multi_hop_questions"])
        ]
        return single + multi

    def rescore(
        self,
        records: Mapping[str, Mapping],
        cases: Mapping[str, Mapping],
        *,
        cut: Cut | None = None,
        whole_word_max: int = 0,
    ) -> Mapping[str, Mapping]:
        """Copies of the records whose Ind and Cmp are recomputed from their stored answers with
        ``mquake_case_scores(..., whole_word_max=...)``; the copies keep the cut answers."""
        if not (cut or whole_word_max):
            return records
        out = {}
        for cid, rec in records.items():
            case = cases.get(cid)
            if case is None:
                raise ValueError(
                    f"case {cid} is not in the MQuAKE-uns data "
                    "given; pass the --data directory the runs used"
                )
            answers = rec.get("answers") or {}
            if "single_hop" not in answers or "multi_hop" not in answers:
                raise ValueError(
                    f"case {cid}: the record keeps no single_hop/multi_hop "
                    "answers, so it cannot be rescored"
                )
            single, multi = list(answers["single_hop"]), list(answers["multi_hop"])
            if cut is not None:
                single, multi = [cut(a) for a in single], [cut(a) for a in multi]
            out[cid] = {
                **rec,
                "answers": {**answers, "single_hop": single, "multi_hop": multi},
                **mquake_case_scores(
                    single,
                    case["single_hop_answers"],
                    multi,
                    case["multi_hop_answers"],
                    whole_word_max=whole_word_max,
                ),
            }
        return out

    def composition(self, records: Sequence[Mapping[str, Any]]) -> dict[str, int]:
        return composition_given_hops(records)

    def score(
        self, case: Mapping[str, Any], answers: Sequence[str], judge: Judge | None = None
    ) -> dict:
        n = len(case["single_hop_questions"])
        single, multi = list(answers[:n]), list(answers[n:])
        scores = mquake_case_scores(
            single, case["single_hop_answers"], multi, case["multi_hop_answers"]
        )
        return {"answers": {"single_hop": single, "multi_hop": multi}, **scores}

    def answers_of(self, record: Mapping[str, Any]) -> list[str]:
        a = record["answers"]
        return [*a["single_hop"], *a["multi_hop"]]


#: UnKEBench's own options: how subjects are found, and the MMLU subset measured around each edit
UNKE_OPTIONS = (
    Option(
        "subjects",
        "--subjects",
        "auto",
        choices=SUBJECT_MODES,
        help="subject phrases for 'Introduce {s}.': file, generated by the judge model, or "
        "heuristic; auto = file, then judge model, then a logged heuristic fallback",
    ),
    Option(
        "subjects_file",
        "--subjects-file",
        None,
        metavar="FILE",
        must_exist="give an id -> subject JSON file",
        help=f"id -> subject JSON (default --data/{UNKE_SUBJECTS_FILE})",
    ),
    Option(
        "mmlu_n",
        "--mmlu-n",
        100,
        type=int,
        minimum=0,
        what="0 skips MMLU",
        help="MMLU subset size for locality (0 skips it; default 100)",
    ),
    Option(
        "mmlu_shots",
        "--mmlu-shots",
        5,
        type=int,
        minimum=0,
        what="dev examples per MMLU prompt",
        help="dev examples per MMLU prompt (default 5)",
    ),
    Option(
        "mmlu_seed", "--mmlu-seed", 0, type=int, help="seed of the fixed MMLU subset (default 0)"
    ),
    Option(
        "mmlu_batch_size",
        "--mmlu-batch-size",
        4,
        type=int,
        minimum=1,
        what="MMLU prompts at once",
        cli=False,
    ),
    Option(
        "mmlu_every",
        "--mmlu-every",
        1,
        type=int,
        minimum=1,
        what="1 = MMLU after every edit",
        metavar="K",
        help="MMLU after every K-th edit only (cases or blocks 0, K, 2K, ...; default 1 = every "
        "edit): on a CPU the 5-shot subset costs more than the edit",
    ),
)


class UnKEBench(Task):
    """Jnt: FActScore of the answers to ``question`` and ``para_question``; Dmp: judge per
    sub-question; Div: 1 - SelfBLEU-4 among the sub-question answers. Records and summaries also
    carry UnKE's own judge-free metrics (``unke_metrics``: BLEU and ROUGE against the passage and
    the gold sub-answers, ``benchmarks.tasks.unke_scores``)."""

    name = "unkebench"
    title = "UnKEBench"
    data_file = UNKE_FILE
    default_max_new_tokens = 200
    metrics = ("Jnt", "Dmp", "Div")
    table_columns = (
        ("Jnt", "Jnt"),
        ("Dmp", "Dmp"),
        ("Div", "Div"),
        ("Avg", "Avg"),
        ("MMLU", "MMLU_after"),
    )
    needs_judge = True
    measures_mmlu = True
    recitation_note = (
        "UnKEBench: Div is recomputed on the cut answers; Jnt and Dmp by rerunning the offline "
        "lexical judge on them (n/a for runs scored by "
        "an LLM judge, which cannot be rerun offline)."
    )

    data_option = Option(
        "data_file",
        "--unke-file",
        None,
        metavar="FILE",
        help=f"UnKEBench file, relative to --data (default {UNKE_FILE}; v3 works too)",
    )
    options = UNKE_OPTIONS

    def load(
        self, data_dir: Path, opts: Any, client: Any, cache_dir: Path, template: str
    ) -> tuple[Any, list[Path]]:
        file, own = opts.data_file or self.data_file, opts.task_options
        subjects_file = (
            Path(own["subjects_file"]) if own["subjects_file"] else data_dir / UNKE_SUBJECTS_FILE
        )
        cases = load_unkebench(
            data_dir,
            file=file,
            limit=opts.limit,
            subjects=own["subjects"],
            subjects_file=subjects_file,
            client=client,
            cache_dir=cache_dir,
            prompt_template=template,
        )
        paths = [data_path(data_dir, file)]
        if subjects_file.is_file() and own["subjects"] in {"auto", "file"}:
            paths.append(subjects_file)
        return cases, paths

    def load_cases(
        self,
        data_dir: str | Path,
        file: str | Path | None = None,
        *,
        limit: int | None = None,
        subjects: str = "heuristic",
    ) -> list[dict]:
        return load_unkebench(data_dir, file=file or self.data_file, limit=limit, subjects=subjects)

    def run_config(self, options: Mapping[str, Any], judge: Judge | None, mmlu: bool) -> dict:
        o = options
        config: dict[str, Any] = {
            "judge": judge.name if judge else None,
            "subjects": o["subjects"],
            "mmlu": {"n": o["mmlu_n"], "shots": o["mmlu_shots"], "seed": o["mmlu_seed"]}
            if mmlu
            else None,
        }
        if (
            mmlu and o["mmlu_every"] != 1
        ):  # absent at 1, so run directories from before the option still match
            config["mmlu"]["every"] = o["mmlu_every"]
        return config

    def questions(self, case: Mapping[str, Any]) -> list[str]:
        return [case["question"], case["para_question"], *case["sub_questions"]]

    def case_questions(self, case: Mapping[str, Any]) -> list[Question]:
        joint = [
            Question(
                f"{key} (Jnt)", case[key], None, key, check="facts", facts=j, in_case_studies=not j
            )
            for j, key in enumerate(("question", "para_question"))
        ]
        return joint + [
            Question("sub-question (Dmp)", q, (g,), "sub_questions", i, check="coverage")
            for i, (q, g) in enumerate(zip(case["sub_questions"], case["sub_answers"]))
        ]

    def rescore(
        self,
        records: Mapping[str, Mapping],
        cases: Mapping[str, Mapping],
        *,
        cut: Cut | None = None,
        whole_word_max: int = 0,
    ) -> Mapping[str, Mapping]:
        """Copies of the records rescored from their stored answers, each cut by ``cut`` first
        (``_rescored_unke``); no aliases to rescore: ``whole_word_max`` is not used."""
        if cut is None:
            return records
        lexical = LexicalJudge()
        return {
            cid: _rescored_unke(self, cid, rec, cases, cut, lexical) for cid, rec in records.items()
        }

    def score(self, case: Mapping[str, Any], answers: Sequence[str], judge: Judge | None) -> dict:
        if judge is None:
            raise ValueError("UnKEBench needs a judge (an LLM endpoint or the lexical fallback)")
        joint, subs = list(answers[:2]), list(answers[2:])
        rec: dict[str, Any] = {
            "answers": {"question": joint[0], "para_question": joint[1], "sub_questions": subs},
            "Div": diversity(subs),
            "judge": judge.name,
        }
        rec[UNKE_METRICS] = record_metrics(case["passage"], case["sub_answers"], rec["answers"])
        rec.update(_judged_unke(case, joint, subs, judge))
        return rec

    def unjudged_record(
        self, case: Mapping[str, Any], answers: Sequence[str], judge: Judge, error: JudgeError
    ) -> dict:
        """The record of a case whose judge failed for good: the answers and Div kept, Jnt/Dmp
        unjudged (not 0)."""
        return _unjudged_unke(case, answers, judge, error)

    def answers_of(self, record: Mapping[str, Any]) -> list[str]:
        a = record["answers"]
        return [a["question"], a["para_question"], *a["sub_questions"]]

    def summarize(self, records: Sequence[Mapping[str, Any]]) -> dict:
        out = super().summarize(records)
        out["judge_incomplete_cases"] = sum(not r.get("judge_complete", True) for r in records)
        out["unjudged_cases"] = sum(bool(unjudged_metrics(r)) for r in records)
        # records written before UnKE's metrics existed have none: their summaries stay as they were
        if records and all(UNKE_METRICS in r for r in records):
            out[UNKE_METRICS] = summarize_metrics([r[UNKE_METRICS] for r in records])
        return out


def _unjudged_unke(
    case: Mapping[str, Any], answers: Sequence[str], judge: Judge, error: JudgeError
) -> dict:
    subs = list(answers[2:])
    stored = {"question": answers[0], "para_question": answers[1], "sub_questions": subs}
    return {
        "answers": stored,
        UNKE_METRICS: record_metrics(case["passage"], case["sub_answers"], stored),
        "Div": diversity(subs),
        "judge": judge.name,
        "factscore": None,
        "dmp_scores": None,
        "Jnt": None,
        "Dmp": None,
        "judge_complete": False,
        "unjudged": ["Jnt", "Dmp"],
        "judge_error": " ".join(str(error).split())[:300],
    }


def _judged_unke(
    case: Mapping[str, Any], joint: Sequence[str], subs: Sequence[str], judge: Judge
) -> dict:
    """Jnt (the judge's FActScore of the two joint answers) and Dmp (its coverage of each
    sub-answer) of one UnKEBench case. An answer the judge could not judge is unjudged (None),
    never a 0; the next run judges it again."""
    facts = [judge.factscore(a, case["passage"], case["subject"]) for a in joint]
    items = [
        CoverageItem(q, e, a) for q, e, a in zip(case["sub_questions"], case["sub_answers"], subs)
    ]
    dmp, dmp_complete = judge.coverage(items)
    jnt_complete = all(f.complete for f in facts)
    unjudged = [m for m, ok in (("Jnt", jnt_complete), ("Dmp", dmp_complete)) if not ok]
    out = dict(
        factscore=[f.to_dict() for f in facts],
        dmp_scores=dmp,
        Jnt=mean(f.score for f in facts) if jnt_complete else None,
        Dmp=mean(dmp) if dmp_complete else None,
        judge_complete=not unjudged,
    )
    if unjudged:
        out["unjudged"] = unjudged
    return out


def _rescored_unke(
    task: UnKEBench,
    cid: str,
    rec: Mapping[str, Any],
    cases: Mapping[str, Mapping],
    cut: Cut,
    lexical: LexicalJudge,
) -> dict:
    """A copy of one UnKEBench record rescored from its stored answers, each cut by ``cut`` first.

    Div (1 - SelfBLEU-4 of the sub-question answers) is recomputed for every record. Jnt and Dmp
    are recomputed only where the record was scored by the offline lexical judge, by rescoring the
    cut answers with that judge (the passage and gold sub-answers come from ``cases``; UnKE's
    metrics are recomputed with them); a record scored by an LLM judge gets Jnt and Dmp None, since
    that judge cannot be rerun offline, and loses the UnKE metrics of its uncut answers.
    """
    answers = rec.get("answers") or {}
    if not all(k in answers for k in ("question", "para_question", "sub_questions")):
        raise ValueError(
            f"case {cid}: the record keeps no question/para_question/sub_questions "
            "answers, so it cannot be rescored"
        )
    texts = [cut(a) for a in task.answers_of(rec)]
    if rec.get("judge") == LEXICAL_JUDGE_NAME:
        case = cases.get(cid)
        if case is None:
            raise ValueError(
                f"case {cid} is not in the UnKEBench data "
                "given; pass the --data directory the runs used"
            )
        return {**rec, **task.score(case, texts, lexical)}
    kept = {k: v for k, v in rec.items() if k != UNKE_METRICS}
    cut_answers = {"question": texts[0], "para_question": texts[1], "sub_questions": texts[2:]}
    return {**kept, "answers": cut_answers, "Jnt": None, "Dmp": None, "Div": diversity(texts[2:])}


def composition_given_hops(recs: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """MQuAKE-uns: ``cases`` given, ``all_hops`` (cases with every single hop answered, Ind = 1) and
    ``composed`` (of those, the ones whose multi-hop question was answered too, Cmp = 1)."""
    full = [r for r in recs if float(r["Ind"]) >= 1.0 - 1e-9]
    return {
        "cases": len(recs),
        "all_hops": len(full),
        "composed": sum(float(r["Cmp"]) >= 0.5 for r in full),
    }


def unjudged_metrics(record: Mapping[str, Any]) -> list[str]:
    """The judge metrics of a record that still need a judge (records written before ``unjudged``
    existed count as unjudged when the judge did not finish them)."""
    if record.get("unjudged"):
        return list(record["unjudged"])
    return ["Jnt", "Dmp"] if record.get("judge_complete") is False else []


TASKS: dict[str, Task] = {t.name: t for t in (UnKEBench(), MQuAKEUns())}
