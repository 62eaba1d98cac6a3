"""benchmarks.analysis.variants: the sensitivity and ablation tables (variants of one method against
a reference) from finished runs."""

import json

import pytest

from benchmarks.analysis.variants import main, variant_rows, variants_table


def _run(path, T, scores, stepin=None):
    """A finished MQuAKE-uns run (``--sequential T`` or single editing for T = 1): ``scores`` =
    [(Ind, Cmp), ...] in case order, ``stepin`` = the step-in rate of each round of every case."""
    path.mkdir(parents=True)
    config = {"benchmark": "mquake-uns", "sequential": T if T > 1 else None}
    (path / "config.json").write_text(json.dumps(config))
    with open(path / "results.jsonl", "w") as fh:
        for i, (ind, cmp) in enumerate(scores):
            rec = {"case_id": str(i), "index": i, "block": i // T, "Ind": ind, "Cmp": cmp}
            if stepin is not None:
                rec["rounds"] = [{"stepin_rate": r} for r in stepin]
            fh.write(json.dumps(rec) + "\n")
    return str(path)


def test_rows_hold_the_paired_difference_and_the_stepin_rate_per_round(tmp_path):
    shipped = _run(tmp_path / "k03", 1, [(1.0, 0.0), (0.5, 0.0), (0.0, 0.0)], [0.2, 0.1])
    low = _run(tmp_path / "k01", 1, [(1.0, 1.0), (0.5, 0.0), (0.5, 0.0)], [0.5, 0.25])
    rows = variant_rows([("0.1", low), ("0.3", shipped)], "0.3", resamples=200)
    k01, k03 = rows
    assert k01["Ind"] == pytest.approx(200 / 3) and k01["Cmp"] == pytest.approx(100 / 3)
    # per case Avg differences: +50, 0, +25
    assert k01["diff"] == pytest.approx(25.0)
    assert k01["diff_ci"][0] <= 25.0 <= k01["diff_ci"][1]
    assert "diff" not in k03 and k03["reference"]
    assert k01["stepin"] == pytest.approx([0.5, 0.25])
    table = variants_table(rows, "kappa")
    assert "| kappa | cases | Ind | Cmp | Avg |" in table
    assert "| 0.1 | 3 | 66.7 | 33.3 | 50.0 | +25.0 [" in table and "| 50.0, 25.0 |" in table
    assert "| 0.3 † | 3 |" in table and "(reference) | 20.0, 10.0 |" in table
    assert "T |" not in table  # single editing: no sequence columns


def test_single_editing_runs_meet_on_their_common_cases_and_sequences_must_match(tmp_path):
    full = _run(tmp_path / "full", 1, [(1.0, 1.0), (0.0, 0.0), (1.0, 0.0)])
    part = _run(tmp_path / "part", 1, [(0.0, 0.0), (0.0, 0.0)])
    rows = variant_rows([("w/o HP", part), ("Ours", full)], "Ours", resamples=100)
    assert [r["cases"] for r in rows] == [2, 2] and rows[1]["held"] == 3
    assert rows[0]["diff"] == pytest.approx(-50.0)
    assert "2 cases in every run (of them the runs hold: Ours 3)" in variants_table(rows)
    seq_a = _run(tmp_path / "sa", 2, [(1.0, 0.0), (0.0, 0.0), (1.0, 1.0), (0.0, 0.0)])
    seq_b = _run(tmp_path / "sb", 2, [(1.0, 0.0), (0.0, 0.0)])
    with pytest.raises(ValueError, match="hold different cases"):
        variant_rows([("a", seq_a), ("b", seq_b)], "a")
    with pytest.raises(ValueError, match="one benchmark at one T"):
        variant_rows([("a", seq_a), ("f", full)], "a")


def test_sequential_rows_carry_T_and_the_avg_of_each_sequence(tmp_path, capsys):
    ours = _run(tmp_path / "ours", 2, [(1.0, 0.0), (1.0, 0.0), (0.0, 0.0), (0.0, 0.0)], [0.1])
    nohp = _run(tmp_path / "nohp", 2, [(0.0, 0.0), (1.0, 0.0), (0.0, 0.0), (0.0, 0.0)], [0.0])
    assert main(["--run", "w/o HP", nohp, "--run", "Ours", ours, "--reference", "Ours"]) == 0
    out = capsys.readouterr().out
    assert "| w/o HP | 2 | 2 | 4 | 25.0 | 0.0 | 12.5 | 25.0, 0.0 | -12.5 [" in out
    assert "| Ours † | 2 | 2 | 4 | 50.0 | 0.0 | 25.0 | 50.0, 0.0 | (reference) | 10.0 |" in out


def test_command_line_mistakes_are_one_line(tmp_path, capsys):
    a = _run(tmp_path / "a", 1, [(1.0, 0.0)])
    b = _run(tmp_path / "b", 1, [(0.0, 0.0)])
    assert main(["--run", "x", a, "--reference", "x"]) == 2
    assert "give at least two" in capsys.readouterr().err
    assert main(["--run", "x", a, "--run", "y", b, "--reference", "z"]) == 2
    assert "--reference 'z' is none of the --run labels" in capsys.readouterr().err
    assert main(["--run", "x", a, "--run", "x", b, "--reference", "x"]) == 2
    assert "repeat" in capsys.readouterr().err
    assert main(["--run", "x", a, "--run", "y", str(tmp_path / "nope"), "--reference", "x"]) == 2
    err = capsys.readouterr().err
    assert "nope" in err and len(err.strip().splitlines()) == 1


def test_first_compares_the_sequences_every_variant_ran(tmp_path, capsys):
    # ours went on to a second sequence of 2; nohp ran only the first
    ours = _run(tmp_path / "ours", 2, [(1.0, 0.0), (1.0, 0.0), (0.0, 0.0), (1.0, 1.0)], [0.1])
    nohp = _run(tmp_path / "nohp", 2, [(0.0, 0.0), (1.0, 0.0)], [0.0])
    with pytest.raises(ValueError, match="hold different cases"):
        variant_rows([("w/o HP", nohp), ("Ours", ours)], "Ours")
    rows = variant_rows([("w/o HP", nohp), ("Ours", ours)], "Ours", resamples=100, first=2)
    assert [r["cases"] for r in rows] == [2, 2] and [r["sequences"] for r in rows] == [1, 1]
    assert rows[0]["diff"] == pytest.approx(-25.0) and rows[1]["Avg"] == pytest.approx(50.0)
    assert "2 cases in every run (of them the runs hold: Ours 4)" in variants_table(rows)
    args = ["--run", "w/o HP", nohp, "--run", "Ours", ours, "--reference", "Ours"]
    assert main([*args, "--first", "2"]) == 0
    assert (
        "| Ours † | 2 | 1 | 2 | 100.0 | 0.0 | 50.0 | 50.0 | (reference) |"
        in capsys.readouterr().out
    )
    assert main([*args, "--first", "3"]) == 2  # cuts a sequence
    assert "--first 3 cuts a sequence of 2 cases" in capsys.readouterr().err
    assert main([*args, "--first", "4"]) == 2  # more than nohp ran
    assert "holds 2 cases; finish it on at least --limit 4" in capsys.readouterr().err
    assert main([*args, "--first", "0"]) == 2
    assert "--first must be >= 1" in capsys.readouterr().err
