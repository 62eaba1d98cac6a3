"""benchmarks/analysis/study.py: RESULTS.md's marked tables regenerated from run directories, and
--check."""

import json
import re
import shlex
from pathlib import Path

import pytest

from benchmarks.analysis.study import (
    StudyError,
    check,
    find_blocks,
    generate,
    main,
    prose_numbers,
    table_numbers,
    write,
)

ROOT = Path(__file__).resolve().parents[1]


def _run(path, records, benchmark="mquake-uns"):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"benchmark": benchmark}))
    (path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _study(tmp_path):
    """A study root with two hand-made runs and a results document with one empty marked block."""
    root = tmp_path / "study"
    _run(
        root / "b1" / "lora",
        [
            {"case_id": "1", "index": 0, "Ind": 0.5, "Cmp": 0.0, "edit_seconds": 10.0},
            {"case_id": "2", "index": 1, "Ind": 1.0, "Cmp": 1.0, "edit_seconds": 30.0},
        ],
    )
    _run(
        root / "b1" / "hpse",
        [
            {
                "case_id": "1",
                "index": 0,
                "Ind": 1.0,
                "Cmp": 1.0,
                "edit_seconds": 40.0,
                "MMLU_after": 23.0,
            },
            {"case_id": "2", "index": 1, "Ind": 1.0, "Cmp": 1.0, "edit_seconds": 50.0},
        ],
    )
    results = tmp_path / "RESULTS.md"
    results.write_text(
        "# Results\n\nHPSE is +37.5 Avg above LoRA (`lr 5e-4`, kappa `0.3`).\n\n"
        "<!-- study: paired b1/lora b1/hpse --label LoRA --label HPSE --resamples 200 -->\n<!-- "
        "/study -->\n\n<!-- study: runs b1/lora b1/hpse -->\n<!-- /study -->\n"
    )
    return root, results


def test_write_then_check_passes_and_one_altered_number_fails(tmp_path, capsys):
    root, results = _study(tmp_path)
    assert main([str(root), "--results", str(results), "--write"]) == 0
    text = results.read_text()
    assert (
        "| Avg | 62.5 [25.0, 100.0] | 100.0 [100.0, 100.0] | +37.5" in text
    )  # Avg per case: (25, 100) vs (100, 100)
    assert "A = b1/lora, B = b1/hpse" in text  # paths relative to the study root
    assert (
        "| hpse | 2 | - | 1: 23 | 45 |" in text
    )  # runs: cases, MMLU after edit 1, median edit seconds
    assert main([str(root), "--results", str(results), "--check"]) == 0
    capsys.readouterr()
    results.write_text(text.replace("| Avg | 62.5", "| Avg | 62.4"))
    assert main([str(root), "--results", str(results), "--check"]) == 1
    err = capsys.readouterr().err
    assert "the committed runs give '| Avg | 62.5" in err and "'| Avg | 62.4" in err
    line = next(i for i, x in enumerate(text.splitlines(), 1) if x.startswith("| Avg | 62.5"))
    assert f"RESULTS.md:{line}:" in err
    # a number in the prose that no regenerated table holds fails too; settings in code spans do not
    results.write_text(text.replace("+37.5 Avg", "+37.4 Avg"))
    assert main([str(root), "--results", str(results), "--check"]) == 1
    assert (
        "RESULTS.md:3: +37.4 is in no table regenerated from the committed runs"
        in capsys.readouterr().err
    )
    # so does a win/loss count that no table holds (the table says 1 / 1 / 0)
    for prose, rc in (("(1 wins, 0 losses)", 0), ("(2 wins, 0 losses)", 1)):
        results.write_text(text.replace("Avg above LoRA", "Avg above LoRA " + prose))
        assert main([str(root), "--results", str(results), "--check"]) == rc
    assert "2 wins, 0 losses is in no table" in capsys.readouterr().err
    # --write restores the blocks (the prose is the author's)
    results.write_text(text.replace("| Avg | 62.5", "| Avg | 62.4"))
    assert main([str(root), "--results", str(results), "--write"]) == 0
    assert results.read_text() == text


def test_prose_numbers_skip_blocks_code_comments_and_links():
    text = (
        "a 1.5 b `2.5`\n```\n3.5\n```\n<!-- 4.5 -->\n[x](img/v1.5.png) Qwen2.5-7B v2.13.0 -0.8%\n"
        "<!-- study: paired x -->\n6.5\n<!-- /study -->\n+7.5, 51% "
        "of it; 13 wins, 10 losses; 2 wins / 1 loss in 23 records\n"
    )
    assert prose_numbers(text) == [
        (1, "1.5"),
        (6, "-0.8"),
        (10, "+7.5"),
        (10, "51"),
        (10, "13 wins, 10 losses"),
        (10, "2 wins / 1 loss"),
    ]


def test_bad_markers_and_roots_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(StudyError, match="RESULTS.md:2: a '<!-- study: ... -->' marker without"):
        find_blocks("x\n<!-- study: paired a b -->\n| table |\n")
    root, results = _study(tmp_path)
    results.write_text("<!-- study: rerun b1/lora -->\n<!-- /study -->\n")
    assert main([str(root), "--results", str(results), "--check"]) == 2
    assert "unknown tool 'rerun'" in capsys.readouterr().err
    results.write_text("<!-- study: paired b1/lora b1/gone -->\n<!-- /study -->\n")
    assert main([str(root), "--results", str(results), "--check"]) == 2
    err = capsys.readouterr().err
    assert f"{results}:1: the marker's command failed (error: b1/gone: no config.json" in err
    assert f"run directories are named relative to {root}" in err and len(err.splitlines()) == 1
    assert main([str(tmp_path / "nowhere"), "--results", str(results)]) == 2
    assert "no such study directory" in capsys.readouterr().err
    results.write_text("# nothing marked\n")
    assert main([str(root), "--results", str(results), "--check"]) == 2
    assert "no '<!-- study: ... -->' block" in capsys.readouterr().err
    assert main([str(root), "--results", str(tmp_path / "missing.md")]) == 2


@pytest.mark.slow
def test_results_md_agrees_with_the_committed_runs(tmp_path):
    """The real check: every marked table of docs/RESULTS.md, regenerated from docs/study (about a
    minute)."""
    from benchmarks.tasks.datasets import default_data_dir

    data = Path(default_data_dir())
    if not (data / "unkebench" / "final_data_v2.json").is_file():
        pytest.skip(
            f"UnKEBench data not found under {data} (set "
            "HPSE_DATA_DIR); the rescored tables need it"
        )
    text = (ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8")
    blocks = find_blocks(text)
    study = (
        ROOT / "docs" / "study"
    )  # every block reads committed run directories (UnKEBench and MQuAKE-uns ones)
    assert len(blocks) >= 5 and all(
        any((study / re.sub(r"@\d+$", "", a)).is_dir() for a in shlex.split(b.command)[1:])
        for b in blocks
    )
    generated = generate(blocks, ROOT / "docs" / "study")
    assert check(text, blocks, generated) == []
    assert write(text, blocks, generated) == text
    # every UnKEBench and MQuAKE-uns table carries the recitation diagnostics
    assert all(
        "Recitation diagnostics" in g
        for b, g in zip(blocks, generated)
        if b.command.startswith("paired")
    )
    assert all(
        "answers cut to first sentence" in g
        for b, g in zip(blocks, generated)
        if b.command.startswith("continual")
    )
    # one number altered in a copy, in a table and in the prose: both are caught
    altered = text.replace(
        "| +2.0 [-1.1, +5.1] | 13 / 0 / 10 |", "| +2.1 [-1.1, +5.1] | 13 / 0 / 10 |", 1
    )
    assert altered != text
    problems = check(altered, find_blocks(altered), generated)
    assert len(problems) == 1 and "+2.1 [-1.1, +5.1]" in problems[0]
    # made-up numbers, picked among those no committed table holds (fixed ones stop being made up as
    # tables grow)
    known = table_numbers(generated)
    low, high = [f"{i / 10:.1f}" for i in range(21, 1000) if float(f"{i / 10:.1f}") not in known][
        :2
    ]
    altered = text.replace(
        "in single editing (-4.4 [-7.2, -1.7]", f"in single editing (+{low} [+1.1, +{high}]", 1
    )
    assert altered != text
    problems = check(altered, find_blocks(altered), generated)
    assert any(f"{low} is in no table" in p for p in problems) and any(
        f"{high} is in no table" in p for p in problems
    )


def test_runs_table_shows_the_share_of_edit_time_inside_easyedits_algorithm(tmp_path, capsys):
    from benchmarks.analysis.study import runs_table

    _run(
        tmp_path / "memit",
        [
            {
                "case_id": "1",
                "index": 0,
                "Ind": 0.0,
                "Cmp": 0.0,
                "edit_seconds": 100.0,
                "algorithm_seconds": 90.0,
            },
            {
                "case_id": "2",
                "index": 1,
                "Ind": 0.0,
                "Cmp": 0.0,
                "edit_seconds": 300.0,
                "algorithm_seconds": 210.0,
            },
        ],
    )
    _run(
        tmp_path / "lora",
        [{"case_id": "1", "index": 0, "Ind": 1.0, "Cmp": 0.0, "edit_seconds": 50.0}],
    )
    assert (
        runs_table(
            [str(tmp_path / "lora"), str(tmp_path / "memit"), "--label", "LoRA", "--label", "MEMIT"]
        )
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("| median edit seconds | share in EasyEdit's algorithm |")
    assert (
        out[2] == "| LoRA | 1 | - | - | 50 | - |"
    )  # an editor of this project: nothing inside EasyEdit
    assert out[3] == "| MEMIT | 2 | - | - | 200 | 75% |"  # (90 + 210) / (100 + 300)
    assert (
        runs_table([str(tmp_path / "lora")]) == 0
    )  # without a baseline run the table keeps its five columns
    assert capsys.readouterr().out.splitlines()[0].endswith("| median edit seconds |")


def test_runs_table_counts_the_answers_an_edit_changed(tmp_path, capsys):
    from benchmarks.analysis.study import runs_table

    def rec(case, single, multi):
        return {
            "case_id": case,
            "index": int(case),
            "Ind": 0.0,
            "Cmp": 0.0,
            "edit_seconds": 1.0,
            "answers": {"single_hop": single, "multi_hop": multi},
        }

    _run(tmp_path / "unedited", [rec("1", ["a", "b"], ["c"]), rec("2", ["d"], ["e"])])
    _run(
        tmp_path / "memit",
        [rec("1", ["a", "B"], ["C"]), rec("2", ["d"], ["e"]), rec("3", ["x"], ["y"])],
    )
    assert runs_table([str(tmp_path / "memit"), "--changed-from", str(tmp_path / "unedited")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("| answers changed vs unedited |")
    assert (
        out[2] == "| memit | 3 | - | - | 1 | 2 of 5 |"
    )  # cases 1 and 2 only: the reference has no case 3
    assert runs_table([str(tmp_path / "memit"), "--changed-from", str(tmp_path / "absent")]) == 2


def test_runs_table_lists_a_continual_runs_mmlu_once_per_block(tmp_path, capsys):
    from benchmarks.analysis.study import runs_table

    # two blocks of T = 2: MMLU is measured after each block's last edit and every record of the
    # block carries it
    recs = [
        {
            "case_id": str(i),
            "index": i,
            "block": i // 2,
            "Ind": 0.0,
            "Cmp": 0.0,
            "edit_seconds": 10.0,
            "MMLU_after": [25.0, 27.0][i // 2],
        }
        for i in range(4)
    ]
    _run(tmp_path / "seq", recs)
    assert runs_table([str(tmp_path / "seq"), "--label", "LoRA (T = 2)"]) == 0
    assert capsys.readouterr().out.splitlines()[2] == "| LoRA (T = 2) | 4 | - | 2: 25, 4: 27 | 10 |"


def _copy_run(committed: str, root: Path) -> Path:
    """A copy of a committed run directory under a new study root (its summary.json included)."""
    import shutil

    return Path(shutil.copytree(ROOT / "docs" / "study" / committed, root / Path(committed).name))


def _planted(path: Path, change) -> None:
    summary = json.loads(path.read_text())
    change(summary)
    path.write_text(json.dumps(summary, indent=1))


def test_check_recomputes_every_summary_and_names_a_stale_field(tmp_path, capsys):
    from benchmarks.analysis.study import summary_problems

    root = tmp_path / "study"
    run = _copy_run("gates/mq-kappa0.3-check", root)  # 3 MQuAKE-uns cases, no data needed
    seq = _copy_run("mquake-uns-continual-50/mq-seq50-lora", root)  # checkpoints 10 and 20
    assert summary_problems(root) == ([], 2)
    committed = (run / "summary.json").read_text()
    # provenance may differ: the label and the directory the run was written to
    _planted(run / "summary.json", lambda s: s.update(label="renamed", out_dir="elsewhere"))
    assert summary_problems(root) == ([], 2)
    # a stale case count, a wrong mean, a missing key, a wrong checkpoint figure: each is named
    _planted(run / "summary.json", lambda s: s.update(n_cases=2, Avg=s["Avg"] + 0.1))
    _planted(seq / "summary.json", lambda s: s["checkpoints"]["10"].update(Ind=99.0))
    _planted(seq / "summary.json", lambda s: s.pop("stepin_rate_by_round"))
    problems, n = summary_problems(root)
    assert n == 2 and len(problems) == 4, problems
    stored = json.loads(committed)
    assert any(
        p.startswith(f"{run / 'summary.json'}: n_cases: stored 2, recomputed 3;") for p in problems
    )
    assert any(f"Avg: stored {stored['Avg'] + 0.1!r}, recomputed" in p for p in problems)
    assert any(f"{seq / 'summary.json'}: checkpoints.10.Ind: stored 99.0" in p for p in problems)
    assert any("stepin_rate_by_round: stored absent, recomputed [" in p for p in problems)
    assert all("--write-summaries` rewrites it from its records" in p for p in problems)
    # --check fails on them before (and beside) the results document's own problems
    results = tmp_path / "RESULTS.md"
    results.write_text("<!-- study: runs mq-kappa0.3-check -->\n<!-- /study -->\n")
    assert main([str(root), "--results", str(results), "--write"]) == 0
    assert main([str(root), "--results", str(results), "--check"]) == 1
    err = capsys.readouterr().err
    assert f"{run / 'summary.json'}: n_cases: stored 2, recomputed 3" in err
    # --write-summaries rewrites the stale ones from their records, keeping the provenance
    assert main([str(root), "--write-summaries"]) == 0
    assert "2 summary.json file(s) rewritten" in capsys.readouterr().out
    rewritten = json.loads((run / "summary.json").read_text())
    assert rewritten["label"] == "renamed" and rewritten["out_dir"] == "elsewhere"
    assert {k: v for k, v in rewritten.items() if k not in ("label", "out_dir")} == {
        k: v for k, v in stored.items() if k not in ("label", "out_dir")
    }
    assert summary_problems(root) == ([], 2)
    assert main([str(root), "--results", str(results), "--check"]) == 0
    assert "and its 2 summary.json file(s) with their records" in capsys.readouterr().out


def test_a_summary_compares_numbers_to_rounding_and_skips_what_the_machine_decides():
    from benchmarks.analysis.summaries import summary_differences

    stored = {
        "Avg": 50.0,
        "label": "a",
        "unke_metrics": {
            "Original": {"BLEU SCORE": 30.0, "Bert Score": 70.0},
            "n_cases": 2,
        },
    }
    rebuilt = {
        "Avg": 50.0 + 1e-12,  # the same mean summed in another order
        "label": "b",
        "unke_metrics": {
            "Original": {"BLEU SCORE": 30.0},
            "not_computed": {"Bert Score": "not on this machine"},
            "n_cases": 2,
        },
    }
    assert summary_differences(stored, rebuilt) == []
    rebuilt["unke_metrics"]["Original"]["BLEU SCORE"] = 30.5
    rebuilt["unke_metrics"]["n_cases"] = 3
    assert summary_differences(stored, rebuilt) == [
        "unke_metrics.Original.BLEU SCORE: stored 30.0, recomputed 30.5",
        "unke_metrics.n_cases: stored 2, recomputed 3",
    ]


@pytest.mark.slow
def test_every_committed_summary_agrees_with_its_records():
    """Every summary.json under docs/study, recomputed from its run directory (about a minute)."""
    from benchmarks.analysis.study import summary_problems
    from benchmarks.tasks.datasets import default_data_dir

    data = Path(default_data_dir())
    if not (data / "unkebench" / "final_data_v2.json").is_file():
        pytest.skip(f"UnKEBench data not found under {data}; UnKE's metrics of old runs need it")
    problems, n = summary_problems(ROOT / "docs" / "study")
    assert problems == [] and n == len(list((ROOT / "docs" / "study").rglob("summary.json")))
