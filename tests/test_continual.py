"""benchmarks.analysis.continual: the continual-editing table and bar chart from finished
--sequential runs."""

import json

import pytest

from benchmarks.analysis.continual import continual_rows, continual_table, main


def _run(path, T, scores):
    """A finished MQuAKE-uns --sequential T run: ``scores`` = [(Ind, Cmp), ...] in case order."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"benchmark": "mquake-uns", "sequential": T}))
    with open(path / "results.jsonl", "w") as fh:
        for i, (ind, cmp) in enumerate(scores):
            fh.write(
                json.dumps({"case_id": str(i), "index": i, "block": i // T, "Ind": ind, "Cmp": cmp})
                + "\n"
            )
    return str(path)


def test_rows_hold_the_per_sequence_spread_and_the_paired_difference(tmp_path):
    base = _run(tmp_path / "lora", 2, [(1.0, 0.0), (0.5, 0.0), (0.0, 0.0), (0.0, 0.0)])
    hpse = _run(tmp_path / "hpse", 2, [(1.0, 1.0), (0.5, 0.0), (0.5, 0.0), (0.0, 0.0)])
    rows = continual_rows([(base, hpse)], ["LoRA"], resamples=200)
    lora, plus = rows
    assert (lora["label"], plus["label"]) == ("LoRA", "LoRA + HPSE")
    assert lora["T"] == 2 and lora["sequences"] == 2 and lora["cases"] == 4
    assert (
        lora["Ind"] == pytest.approx(37.5)
        and lora["Cmp"] == 0.0
        and lora["Avg"] == pytest.approx(18.75)
    )
    # per case Avg: 50, 25, 0, 0 -> sequences 37.5 and 0
    assert lora["per_sequence"] == pytest.approx([37.5, 0.0])
    # each metric of each sequence too (the figure's whiskers): Ind 75 and 0, Cmp 0 and 0
    assert lora["per_sequence_metrics"]["Ind"] == pytest.approx([75.0, 0.0])
    assert lora["per_sequence_metrics"]["Avg"] == pytest.approx(lora["per_sequence"])
    # per case differences: +50, 0, +25, 0
    assert plus["diff"] == pytest.approx(18.75)
    assert plus["diff_ci"][0] <= plus["diff"] <= plus["diff_ci"][1]
    table = continual_table(rows)
    assert "| LoRA + HPSE | 2 | 2 | 4 |" in table and "+18.8 [" in table
    assert "paired Δ Ind" not in table  # per metric only when asked
    # per sequence: +25 and +12.5; resampled by sequence, then case, beside the per-case interval
    assert plus["diff_sequences"]["per_sequence"] == pytest.approx([25.0, 12.5])
    lo, hi = plus["diff_sequences"]["ci95"]
    assert 0.0 <= lo <= 18.75 <= hi <= 50.0
    assert f"| +25.0, +12.5 | +18.8 [{lo:+.1f}, {hi:+.1f}] |" in table
    assert "the other resamples sequences, then cases within them" in table
    assert "no between-sequence interval" not in table
    # one sequence of four edits: no interval between sequences, and the table says so
    one = continual_rows(
        [(_run(tmp_path / "l4", 4, [(1.0, 0.0)] * 4), _run(tmp_path / "h4", 4, [(0.0, 0.0)] * 4))],
        ["LoRA"],
        resamples=200,
    )
    assert one[1]["diff_sequences"] == {"mean": -50.0, "per_sequence": [-50.0], "ci95": None}
    table = continual_table(one)
    assert "| -50.0 | none: one sequence |" in table
    assert "With one sequence no between-sequence interval exists" in table
    per_metric = continual_rows([(base, hpse)], ["LoRA"], resamples=200, per_metric=True)
    ind, ind_ci = per_metric[1]["metric_diffs"]["Ind"]
    cmp_, _ = per_metric[1]["metric_diffs"]["Cmp"]
    # Ind differences 0, 0, +50, 0; Cmp +100, 0, 0, 0
    assert (ind, cmp_) == pytest.approx((12.5, 25.0)) and ind_ci[0] <= 12.5 <= ind_ci[1]
    table = continual_table(per_metric)
    assert "| paired Δ Ind [95% CI] | paired Δ Cmp [95% CI] |" in table
    assert "| +12.5 [" in table and "| +25.0 [" in table


def test_unke_adds_the_judge_free_metrics_their_differences_and_panels(tmp_path, monkeypatch):
    """--unke: UnKE's judge-free metrics beside the judge's, per sequence for the figure's whiskers,
    and each + HPSE row's paired difference in them; the figure gains their panels."""
    from benchmarks.analysis import continual

    base = _run(tmp_path / "lora", 2, [(1.0, 0.0)] * 4)
    hpse = _run(tmp_path / "hpse", 2, [(1.0, 0.0)] * 4)
    # Ori BLEU of each case: LoRA 0.8 everywhere, HPSE 0.6, 0.6, 0.4, 0.4; ROUGE-L 0.5 for both
    bleu = {base: [0.8] * 4, hpse: [0.6, 0.6, 0.4, 0.4]}

    def unke(run_dir, run):
        assert run[0] == "mquake-uns" and len(run[1]) == 4  # the loaded run, as load_run gives it
        return {
            str(i): {
                "Original": {"BLEU SCORE": b, "ROUGE-L": 0.5},
                "Sub": {"ROUGE-L": 0.25},
            }
            for i, b in enumerate(bleu[run_dir])
        }

    lora, plus = continual_rows([(base, hpse)], ["LoRA"], resamples=200, unke=unke)
    assert lora["Ori BLEU"] == pytest.approx(80.0) and plus["Ori BLEU"] == pytest.approx(50.0)
    assert plus["per_sequence_metrics"]["Ori BLEU"] == pytest.approx([60.0, 40.0])
    assert plus["Ori R-L"] == pytest.approx(50.0) and plus["Sub R-L"] == pytest.approx(25.0)
    mean, (lo, hi) = plus["unke_diffs"]["Ori BLEU"]
    assert mean == pytest.approx(-30.0) and -40.0 <= lo <= -30.0 <= hi <= -20.0
    assert plus["unke_diffs"]["Ori R-L"] == pytest.approx((0.0, [0.0, 0.0]))
    table = continual_table([lora, plus])
    assert "| Avg | Ori BLEU | Ori R-L | Sub R-L | Avg per sequence |" in table
    assert "| paired Δ Ori BLEU [95% CI] | paired Δ Ori R-L [95% CI] |" in table
    assert f"| -30.0 [{lo:+.1f}, {hi:+.1f}] | +0.0 [+0.0, +0.0] |" in table
    assert "UnKE's own metrics, judge-free" in table
    titles = []
    monkeypatch.setattr("matplotlib.axes.Axes.set_title", lambda ax, t, *a, **k: titles.append(t))
    continual.plot_continual([lora, plus], tmp_path / "c.png")
    assert titles == [
        "Ind",
        "Cmp",
        "Avg",
        *(f"{c} (UnKE, judge-free)" for c in ("Ori BLEU", "Ori R-L", "Sub R-L")),
    ]
    assert (tmp_path / "c.png").stat().st_size > 1000


def test_command_line_writes_the_png_and_refuses_bad_pairs(tmp_path, capsys):
    base = _run(tmp_path / "a", 2, [(1.0, 0.0), (0.0, 0.0)])
    hpse = _run(tmp_path / "b", 2, [(1.0, 1.0), (0.0, 0.0)])
    other_T = _run(tmp_path / "c", 1, [(1.0, 1.0), (0.0, 0.0)])
    png = tmp_path / "continual.png"
    assert main([base, hpse, "--png", str(png), "--resamples", "100"]) == 0
    assert png.stat().st_size > 1000 and "LoRA + HPSE" in capsys.readouterr().out
    assert main([base]) == 2
    assert "pairs" in capsys.readouterr().err
    assert main([base, other_T]) == 2
    assert "a pair is one benchmark at one T" in capsys.readouterr().err
    single = _run(tmp_path / "d", 1, [(1.0, 1.0), (0.0, 0.0)])
    single_hpse = _run(tmp_path / "e", 1, [(1.0, 1.0), (1.0, 0.0)])
    assert (
        main([single, single_hpse, base, hpse, "--resamples", "100"]) == 0
    )  # single editing is T = 1
    out = capsys.readouterr().out
    assert "| LoRA | 1 | 2 | 2 |" in out and "(single editing)" in out


def test_first_reports_a_pair_on_its_first_cases_only(tmp_path, capsys):
    # single editing gone on to 3 cases (the base one case further than +HPSE); the sequences cover
    # 2
    single = _run(tmp_path / "d", 1, [(1.0, 1.0), (0.0, 0.0), (1.0, 1.0), (1.0, 1.0)])
    single_hpse = _run(tmp_path / "e", 1, [(1.0, 1.0), (1.0, 0.0), (0.0, 0.0)])
    base = _run(tmp_path / "a", 2, [(1.0, 0.0), (0.0, 0.0)])
    hpse = _run(tmp_path / "b", 2, [(1.0, 1.0), (0.0, 0.0)])
    assert (
        main([single, single_hpse, base, hpse, "--resamples", "100"]) == 2
    )  # different cases: refused
    assert "different cases" in capsys.readouterr().err
    rows = continual_rows(
        [(single, single_hpse), (base, hpse)], ["LoRA", "LoRA"], resamples=100, first=[2, None]
    )
    assert [r["cases"] for r in rows] == [2, 2, 2, 2]
    assert rows[0]["Avg"] == pytest.approx(50.0) and rows[1]["Avg"] == pytest.approx(75.0)
    assert rows[1]["diff"] == pytest.approx(25.0)
    assert (
        main(
            [
                single,
                single_hpse,
                base,
                hpse,
                "--first",
                "2",
                "--first",
                "all",
                "--resamples",
                "100",
            ]
        )
        == 0
    )
    assert "| LoRA + HPSE | 1 | 2 | 2 |" in capsys.readouterr().out
    assert main([single, single_hpse, base, hpse, "--first", "2"]) == 2
    assert "1 --first for 2 pairs" in capsys.readouterr().err
    assert main([base, hpse, "--first", "1"]) == 2
    assert "cuts a sequence of 2 cases" in capsys.readouterr().err
    assert main([single, single_hpse, "--first", "4"]) == 2
    assert "finish both runs on at least --limit 4" in capsys.readouterr().err
    assert main([single, single_hpse, "--first", "x"]) == 2
    assert "give a positive number of cases or 'all'" in capsys.readouterr().err


def test_recitation_adds_the_cut_differences_of_each_hpse_row(tmp_path, capsys, monkeypatch):
    import benchmarks.analysis.recitation as recitation
    import benchmarks.analysis.runs as runs_module

    filler = " ".join(f"w{i}" for i in range(1, 32))  # 31 tokens: "Croatia" after it is token 32
    cases = {
        "0": {"case_id": "0", "single_hop_answers": [["Croatia"]], "multi_hop_answers": ["Zagreb"]}
    }
    runs = []
    for name, single, multi in (
        ("lora", filler + " Croatia and more", "I do not know. Zagreb is its capital."),
        ("hpse", filler + " w32 Croatia", "Zagreb."),
    ):
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_text(
            json.dumps({"benchmark": "mquake-uns", "hparams": {"model_name": "tiny"}})
        )
        (path / "results.jsonl").write_text(
            json.dumps(
                {
                    "case_id": "0",
                    "index": 0,
                    "Ind": 1.0,
                    "Cmp": 1.0,
                    "answers": {"single_hop": [single], "multi_hop": [multi]},
                }
            )
            + "\n"
        )
        runs.append(str(path))
    monkeypatch.setattr(runs_module, "load_cases", lambda bench, data, why: cases)
    monkeypatch.setattr(recitation, "model_token_spans", lambda name: (None, f"words of {name}"))
    assert main([*runs, "--recitation", "--resamples", "100"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith(
        "| Δ Avg, answers cut to first sentence | Δ Avg, answers cut to first 32 tokens |"
    )
    # official: level; first sentence: LoRA loses Zagreb (+50 for HPSE); 32 tokens: HPSE loses
    # Croatia (-50)
    assert (
        out[2] == "| LoRA | 1 | 1 | 1 | 100.0 | 100.0 | 100.0 | (single editing) |  |  |  |  |  |"
    )
    assert out[3].endswith(
        "| +0.0 [+0.0, +0.0] | (single editing) | (single editing) | +50.0 [+50.0, +50.0] "
        "| -50.0 [-50.0, -50.0] |"
    )
    assert main([*runs, "--recitation", "--recitation-tokens", "31", "--resamples", "100"]) == 0
    assert "first 31 tokens" in capsys.readouterr().out
    monkeypatch.undo()
    assert main([*runs, "--recitation", "--data", str(tmp_path / "nowhere")]) == 2
    assert "--recitation needs the mquake-uns data" in capsys.readouterr().err
