"""benchmarks/analysis/paired.py: per-case paired differences of two runs, by hand-computed
cases."""

import json

import numpy as np
import pytest

from benchmarks.analysis.paired import bootstrap_ci, main, multi_report, paired_report


def _run(path, benchmark, records, name="results.jsonl"):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"benchmark": benchmark}))
    with open(path / name, "a") as fh:
        for rec in records:
            fh.write(json.dumps(rec) + "\n")
    return path


def test_paired_mquake_by_hand(tmp_path):
    a = _run(
        tmp_path / "a",
        "mquake-uns",
        [
            {"case_id": "1", "Ind": 0.5, "Cmp": 0.0},
            {"case_id": "2", "Ind": 1.0, "Cmp": 1.0},
            {"case_id": "3", "Ind": 0.0, "Cmp": 0.0},
            {"case_id": "9", "Ind": 1.0, "Cmp": 1.0},
        ],
    )
    # run B split over two process files, as an accelerate run writes it
    b = _run(
        tmp_path / "b",
        "mquake-uns",
        [{"case_id": "1", "Ind": 1.0, "Cmp": 1.0}],
        "results.rank0-of-2.jsonl",
    )
    _run(
        b,
        "mquake-uns",
        [{"case_id": "2", "Ind": 1.0, "Cmp": 0.0}, {"case_id": "3", "Ind": 0.0, "Cmp": 0.0}],
        "results.rank1-of-2.jsonl",
    )
    r = paired_report(a, b, resamples=2000)
    assert r["cases"] == ["1", "2", "3"] and r["stepin_rate_by_round"] == {"a": [], "b": []}
    assert r["n_cases"] == 3 and r["only_in_a"] == 1 and r["only_in_b"] == 0
    ind, cmp_, avg = r["metrics"]["Ind"], r["metrics"]["Cmp"], r["metrics"]["Avg"]
    assert ind["a"] == pytest.approx(50.0) and ind["b"] == pytest.approx(200 / 3)
    assert ind["diff"] == pytest.approx(50 / 3) and (
        ind["b_wins"],
        ind["ties"],
        ind["b_losses"],
    ) == (1, 2, 0)
    assert cmp_["diff"] == pytest.approx(0.0) and (
        cmp_["b_wins"],
        cmp_["ties"],
        cmp_["b_losses"],
    ) == (1, 1, 1)
    # Avg is the per-case mean of Ind and Cmp: A = (25, 100, 0), B = (100, 50, 0)
    assert avg["a"] == pytest.approx(125 / 3) and avg["b"] == pytest.approx(50.0)
    lo, hi = ind["diff_ci95"]
    assert lo <= ind["diff"] <= hi and lo >= 0.0  # every resampled mean of (+50, 0, 0) is >= 0
    # composition given the hops: A knows every hop of case 2 and chains it; B knows every hop of 1
    # and 2, chains only 1
    assert r["composition_given_hops"] == {
        "a": {"cases": 3, "all_hops": 1, "composed": 1},
        "b": {"cases": 3, "all_hops": 2, "composed": 1},
    }


def test_bootstrap_ci_of_constant_and_spread():
    assert bootstrap_ci([3.0] * 5) == (3.0, 3.0)
    assert bootstrap_ci([-2.5]) == (-2.5, -2.5)  # one case (a paired report on one common case)
    lo, hi = bootstrap_ci([0.0, 100.0] * 10, resamples=4000)
    assert 20 < lo < 50 < hi < 80
    assert (
        abs((50 - lo) - (hi - 50)) <= 2.5
    )  # symmetric data: a symmetric interval, up to resampling noise


def test_bootstrap_ci_is_the_percentile_interval_of_resample_means_from_the_seeded_generator():
    values = [0.1, 0.9, 0.4, 0.4, 1.0, 0.0, 0.7]
    rng = np.random.default_rng(7)
    means = [
        np.mean([values[i] for i in rng.integers(0, len(values), size=len(values))])
        for _ in range(500)
    ]
    assert bootstrap_ci(values, resamples=500, seed=7, level=0.9) == pytest.approx(
        tuple(np.percentile(means, [5, 95]))
    )
    lo, hi = bootstrap_ci(values, resamples=2000, seed=3)
    assert lo < np.mean(values) < hi and bootstrap_ci(values, resamples=2000, seed=3) == (lo, hi)


def test_paired_refuses_mixed_benchmarks_and_non_runs(tmp_path, capsys):
    a = _run(tmp_path / "a", "mquake-uns", [{"case_id": "1", "Ind": 1.0, "Cmp": 1.0}])
    u = _run(tmp_path / "u", "unkebench", [{"case_id": "1", "Jnt": 1.0, "Dmp": 1.0, "Div": 1.0}])
    assert main([str(a), str(u)]) == 2
    assert "compare runs of one benchmark" in capsys.readouterr().err
    assert main([str(a), str(tmp_path / "nothing")]) == 2
    assert "no config.json" in capsys.readouterr().err


def test_paired_cli_table_and_no_overwrite(tmp_path, capsys):
    a = _run(tmp_path / "a", "unkebench", [{"case_id": "1", "Jnt": 0.5, "Dmp": 0.0, "Div": 1.0}])
    b = _run(tmp_path / "b", "unkebench", [{"case_id": "1", "Jnt": 1.0, "Dmp": 0.5, "Div": 0.9}])
    out, png = tmp_path / "p.json", tmp_path / "plot" / "s.png"
    rounds = [{"round": 1, "stepin_rate": 0.25}, {"round": 2, "stepin_rate": 0.05}]
    _run(b, "unkebench", [{"case_id": "2", "Jnt": 1.0, "Dmp": 1.0, "Div": 1.0, "rounds": rounds}])
    _run(
        a,
        "unkebench",
        [
            {
                "case_id": "2",
                "Jnt": 1.0,
                "Dmp": 1.0,
                "Div": 1.0,
                "rounds": [{"round": 1, "stepin_rate": None}],
            }
        ],
    )
    assert (
        main(
            [
                str(a),
                str(b),
                "--label-a",
                "LoRA",
                "--label-b",
                "HPSE",
                "--out",
                str(out),
                "--plot",
                str(png),
            ]
        )
        == 0
    )
    assert png.stat().st_size > 0
    text = capsys.readouterr().out
    assert "| Jnt | 75.0" in text and "HPSE - LoRA" in text and "| Div |" in text
    assert "HPSE: step-in rate by round 25.0%, 5.0%" in text and "LoRA: step-in" not in text
    assert json.loads(out.read_text())["metrics"]["Dmp"]["diff"] == pytest.approx(25.0)
    with pytest.raises(SystemExit):
        main([str(a), str(b), "--out", str(out)])


def test_case_studies_on_real_mquake_case(tmp_path, capsys):
    from pathlib import Path

    from benchmarks.tasks.datasets import default_data_dir, load_mquake_uns

    data = Path(default_data_dir())
    if not (data / "akew" / "MQuAKE-CF.json").is_file():
        pytest.skip(f"MQuAKE-uns data not found under {data} (set HPSE_DATA_DIR)")
    case = load_mquake_uns(data, limit=1)[0]
    n_single, n_multi = len(case["single_hop_questions"]), len(case["multi_hop_questions"])
    answers = {
        "single_hop": ["a%d" % i for i in range(n_single)],
        "multi_hop": ["m%d" % i for i in range(n_multi)],
    }
    a = _run(
        tmp_path / "a",
        "mquake-uns",
        [{"case_id": case["case_id"], "Ind": 0.0, "Cmp": 0.0, "answers": answers}],
    )
    b = _run(
        tmp_path / "b",
        "mquake-uns",
        [{"case_id": case["case_id"], "Ind": 1.0, "Cmp": 1.0, "answers": answers}],
    )
    assert main([str(a), str(b), "--show", "1", "--data", str(data)]) == 0
    text = capsys.readouterr().out
    assert (
        f"#### case {case['case_id']} (a -> b: Ind 0 -> 100 Cmp 0 -> 100)" in text
    )  # labels default to the directory names
    assert "| AnsDiv |" in text and "not a paper metric" in text
    assert case["multi_hop_questions"][2] in text and case["multi_hop_answers"][0] in text
    assert "| m2 | m2 |" in text
    before = _run(
        tmp_path / "unedited",
        "mquake-uns",
        [
            {
                "case_id": case["case_id"],
                "Ind": 0.0,
                "Cmp": 0.0,
                "answers": {"single_hop": ["old"] * n_single, "multi_hop": ["older"] * n_multi},
            }
        ],
    )
    assert main([str(a), str(b), "--show", "1", "--data", str(data), "--before", str(before)]) == 0
    text = capsys.readouterr().out
    assert "| question | expected | before | a | b |" in text and "| older | m2 | m2 |" in text
    with pytest.raises(SystemExit):  # --before is a column of --show
        main([str(a), str(b), "--before", str(before)])


def test_answer_diversity_exposes_recitation(tmp_path):
    recite = (
        "Manila is the capital of the Philippines and the "
        "birthplace of Mark Burnett, who created Tetris."
    )
    same = {"single_hop": [recite, recite], "multi_hop": [recite, recite, recite]}
    varied = {
        "single_hop": ["Mark Burnett created it.", "He was born in Manila."],
        "multi_hop": [
            "Manila.",
            "The creator was born in Manila, the capital.",
            "In the city of Manila.",
        ],
    }
    a = _run(
        tmp_path / "a", "mquake-uns", [{"case_id": "1", "Ind": 1.0, "Cmp": 1.0, "answers": same}]
    )
    b = _run(
        tmp_path / "b", "mquake-uns", [{"case_id": "1", "Ind": 1.0, "Cmp": 1.0, "answers": varied}]
    )
    r = paired_report(a, b, resamples=100)
    assert r["metrics"]["AnsDiv"]["a"] == pytest.approx(0.0) and r["metrics"]["AnsDiv"]["b"] > 50
    assert r["metrics"]["Avg"]["diff"] == pytest.approx(0.0)  # AnsDiv never enters the paper's Avg


def test_more_than_two_runs_one_row_each_on_the_cases_all_finished(tmp_path, capsys):
    rounds = [{"round": 1, "stepin_rate": 0.5}]
    base = _run(
        tmp_path / "lora",
        "mquake-uns",
        [
            {"case_id": "1", "Ind": 0.0, "Cmp": 0.0},
            {"case_id": "2", "Ind": 1.0, "Cmp": 0.0},
            {"case_id": "3", "Ind": 1.0, "Cmp": 1.0},
        ],
    )
    hpse = _run(
        tmp_path / "hpse",
        "mquake-uns",
        [
            {"case_id": "1", "Ind": 1.0, "Cmp": 1.0, "rounds": rounds},
            {"case_id": "2", "Ind": 1.0, "Cmp": 1.0, "rounds": rounds},
        ],
    )
    other = _run(
        tmp_path / "other",
        "mquake-uns",
        [
            {"case_id": "2", "Ind": 0.0, "Cmp": 0.0},
            {"case_id": "1", "Ind": 0.0, "Cmp": 0.0},
            {"case_id": "7", "Ind": 1.0, "Cmp": 1.0},
        ],
    )
    r = multi_report([base, hpse, other], resamples=500)
    assert r["n_cases"] == 2 and r["not_in_all"] == {str(base): 1, str(hpse): 0, str(other): 1}
    first, second = r["pairs"]
    assert (
        first["cases"] == second["cases"] == ["1", "2"]
    )  # case 3 (not in hpse) and 7 (only in other) left out
    assert first["metrics"]["Avg"]["a"] == pytest.approx(25.0) and first["metrics"]["Avg"][
        "b"
    ] == pytest.approx(100.0)
    assert second["metrics"]["Avg"]["diff"] == pytest.approx(-25.0)
    assert (
        main(
            [
                str(base),
                str(hpse),
                str(other),
                "--label",
                "LoRA",
                "--label",
                "HPSE",
                "--label",
                "X",
                "--resamples",
                "200",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "2 cases finished by all 3 runs" in text and "| Avg - LoRA (95% CI) |" in text
    assert (
        "| HPSE | 100.0 [100.0, 100.0] | 100.0 [100.0, 100.0] | 100.0 [100.0, 100.0] | +75.0"
        in text
    )
    assert "| X |" in text and "2 / 0 / 0" in text and "- HPSE: step-in rate by round 50.0%" in text
    assert (
        "- LoRA: every single hop answered in 1 of 2 cases; "
        "the multi-hop question too in 0 of those 1 (0%)" in text
    )
    assert (
        "- X: every single hop answered in 0 of 2 cases; the multi-hop question too in 0 of those 0"
        in text
    )
    assert (
        main([str(base), str(hpse), "--cases", "2,3", "--resamples", "200"]) == 0
    )  # case 3 is not in hpse
    assert "1 cases in both runs" in capsys.readouterr().out
    assert main([str(base), str(hpse), "--cases", "3", "--resamples", "200"]) == 2
    assert "no finished case in common" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # one label per run, and --show only for two runs
        main([str(base), str(hpse), str(other), "--label", "LoRA"])
    with pytest.raises(SystemExit):
        main([str(base), str(hpse), str(other), "--show", "1"])


def test_whole_word_aliases_rescores_stored_answers(tmp_path, capsys):
    from pathlib import Path

    from benchmarks.tasks.datasets import default_data_dir, load_mquake_uns

    data = Path(default_data_dir())
    if not (data / "akew" / "MQuAKE-CF.json").is_file():
        pytest.skip(f"MQuAKE-uns data not found under {data} (set HPSE_DATA_DIR)")
    case = load_mquake_uns(data, limit=1)[0]
    # case 1: hop 0 is Croatia (aliases include "HR"), hop 1 and the multi-hop answer Kolinda
    # Grabar-Kitarović
    assert case["case_id"] == "1" and "HR" in case["single_hop_answers"][0]
    n_multi = len(case["multi_hop_questions"])
    lucky = {
        "single_hop": ["He threw the ball.", "Kolinda Grabar-Kitarović."],  # "hr" inside "threw"
        "multi_hop": ["It is Grabar-Kitarović."] + ["No idea."] * (n_multi - 1),
    }
    right = {
        "single_hop": ["Croatia (HR).", "Kolinda Grabar-Kitarović."],
        "multi_hop": ["No idea."] * n_multi,
    }
    a = _run(
        tmp_path / "a", "mquake-uns", [{"case_id": "1", "Ind": 1.0, "Cmp": 1.0, "answers": lucky}]
    )
    b = _run(
        tmp_path / "b", "mquake-uns", [{"case_id": "1", "Ind": 1.0, "Cmp": 0.0, "answers": right}]
    )
    out = tmp_path / "strict.json"
    assert (
        main([str(a), str(b), "--whole-word-aliases", "3", "--data", str(data), "--out", str(out)])
        == 0
    )
    text = capsys.readouterr().out
    assert "rescored: aliases of <= 3 characters as whole words" in text
    report = json.loads(out.read_text())
    assert report["whole_word_aliases"] == 3
    assert report["metrics"]["Ind"]["a"] == pytest.approx(50.0) and report["metrics"]["Ind"][
        "b"
    ] == pytest.approx(100.0)
    assert report["metrics"]["Cmp"]["a"] == pytest.approx(
        100.0
    )  # a long alias keeps the substring check
    # the default is the official check: the stored scores, untouched
    assert main([str(a), str(b)]) == 0
    assert "| Ind | 100.0" in capsys.readouterr().out
    # a run of another benchmark, or records without answers, cannot be rescored
    uk = _run(tmp_path / "uk", "unkebench", [{"case_id": "1", "Jnt": 0.5, "Dmp": 0.5, "Div": 0.5}])
    assert main([str(uk), str(uk), "--whole-word-aliases", "3", "--data", str(data)]) == 2
    assert "not all mquake-uns runs" in capsys.readouterr().err
    bare = _run(tmp_path / "bare", "mquake-uns", [{"case_id": "1", "Ind": 1.0, "Cmp": 1.0}])
    assert main([str(bare), str(b), "--whole-word-aliases", "3", "--data", str(data)]) == 2
    assert "keeps no single_hop/multi_hop answers" in capsys.readouterr().err


# --------------------------------------------------------------------------- recitation diagnostics
def test_cuts_by_hand():
    from benchmarks.tasks.metrics import cut_to_tokens, first_sentence

    assert first_sentence("The answer is Paris. It is in France.") == "The answer is Paris."
    assert first_sentence("Paris\nFrance is big.") == "Paris" and first_sentence("  ") == ""
    words = " ".join(f"w{i}" for i in range(1, 41))
    assert cut_to_tokens(words, 32) == " ".join(
        f"w{i}" for i in range(1, 33)
    )  # w32 kept, w33 dropped
    assert (
        cut_to_tokens("Yes, it is.", 2) == "Yes,"
        and cut_to_tokens("Yes, it is.", 5) == "Yes, it is."
    )

    def chars(t):  # a tokenizer whose tokens are characters
        return [(i, i + 1) for i in range(len(t))]

    assert cut_to_tokens("abcdef", 3, chars) == "abc" and cut_to_tokens("abc", 3, chars) == "abc"
    with pytest.raises(ValueError, match=">= 1"):
        cut_to_tokens("abc", 0)


def _mq_reciters(tmp_path):
    filler = " ".join(f"w{i}" for i in range(1, 32))  # 31 tokens: "Croatia" after it is token 32
    a = _run(
        tmp_path / "a",
        "mquake-uns",
        [
            {
                "case_id": "1",
                "Ind": 1.0,
                "Cmp": 1.0,
                "answers": {
                    "single_hop": [filler + " Croatia and more words"],
                    "multi_hop": ["I do not know. Zagreb is its capital."],
                },
            }
        ],
    )
    b = _run(
        tmp_path / "b",
        "mquake-uns",
        [
            {
                "case_id": "1",
                "Ind": 1.0,
                "Cmp": 1.0,
                "answers": {"single_hop": [filler + " w32 Croatia"], "multi_hop": ["Zagreb."]},
            }
        ],
    )
    return (
        a,
        b,
        {
            "1": {
                "case_id": "1",
                "single_hop_answers": [["Croatia"]],
                "multi_hop_answers": ["Zagreb"],
            }
        },
    )


def test_recitation_report_mquake_by_hand(tmp_path):
    from benchmarks.analysis.paired import load_run, recitation_report, recitation_table

    a, b, cases = _mq_reciters(tmp_path)
    r = recitation_report([a, b], [load_run(a), load_run(b)], cases, tokens=32, resamples=200)
    got = {
        cut: [(row["Ind"]["mean"], row["Cmp"]["mean"], row["Avg"]["mean"]) for row in rows]
        for cut, rows in r["cuts"].items()
    }
    assert got == {
        "official": [(100.0, 100.0, 100.0)] * 2,
        # A's multi-hop answer puts Zagreb in its second sentence
        "first sentence": [(100.0, 0.0, 50.0), (100.0, 100.0, 100.0)],
        # Croatia is A's 32nd token (kept) and B's 33rd (dropped): an off-by-one flips both
        "first 32 tokens": [(100.0, 100.0, 100.0), (0.0, 100.0, 50.0)],
    }
    assert r["cuts"]["first sentence"][0]["Avg"]["kept"] == pytest.approx(0.5)
    assert r["cuts"]["first 32 tokens"][1]["Ind"]["kept"] == pytest.approx(0.0)
    d = r["cuts"]["first 32 tokens"][1]["Avg_diff"]
    assert d["diff"] == pytest.approx(-50.0) and (d["wins"], d["ties"], d["losses"]) == (0, 0, 1)
    assert r["cuts"]["first sentence"][1]["Avg_diff"]["diff"] == pytest.approx(50.0)
    r31 = recitation_report([a, b], [load_run(a), load_run(b)], cases, tokens=31, resamples=200)
    assert [row["Ind"]["mean"] for row in r31["cuts"]["first 31 tokens"]] == [0.0, 0.0]
    text = recitation_table(r, ["LoRA", "HPSE"])
    assert "| LoRA | first sentence | 100.0 (100%) | 0.0 (0%) | 50.0 (50%) |  |  |" in text
    assert (
        "| HPSE | first 32 tokens | 0.0 (0%) | 100.0 (100%) "
        "| 50.0 (50%) | -50.0 [-50.0, -50.0] | 0 / 0 / 1 |" in text
    )


def test_recitation_report_unkebench_reruns_the_lexical_judge_only(tmp_path):
    from benchmarks.analysis.paired import load_run, recitation_report, recitation_table
    from benchmarks.tasks.metrics import diversity

    case = {
        "case_id": "5",
        "subject": "Wise",
        "passage": "Wise is a music producer. He worked with Adele.",
        "question": "Who is Wise?",
        "para_question": "Tell me about Wise.",
        "sub_questions": ["Who has Wise worked with?", "What is Wise's job?"],
        "sub_answers": ["Adele.", "A music producer."],
    }
    subs = ["Wise is a music producer. He worked with Adele.", "Wise is a music producer."]
    answers = {"question": subs[0], "para_question": subs[1], "sub_questions": subs}
    lexical = _run(
        tmp_path / "lex",
        "unkebench",
        [
            {
                "case_id": "5",
                "Jnt": 1.0,
                "Dmp": 1.0,
                "Div": 0.25,
                "judge": "lexical-fallback",
                "answers": answers,
            }
        ],
    )
    llm = _run(
        tmp_path / "llm",
        "unkebench",
        [
            {
                "case_id": "5",
                "Jnt": 0.5,
                "Dmp": 1.0,
                "Div": 0.25,
                "judge": "gpt-4o-mini",
                "answers": answers,
            }
        ],
    )
    r = recitation_report(
        [lexical, llm], [load_run(lexical), load_run(llm)], {"5": case}, tokens=3, resamples=100
    )
    official, first = r["cuts"]["official"], r["cuts"]["first sentence"]
    assert official[0]["Div"]["mean"] == pytest.approx(25.0)  # the stored scores, untouched
    # cut to "Wise is a music producer.", the Adele sub-question is no longer answered: Dmp 1 -> 1/2
    assert first[0]["Dmp"]["mean"] == pytest.approx(50.0) and first[0]["Jnt"][
        "mean"
    ] == pytest.approx(100.0)
    assert first[0]["Div"]["mean"] == pytest.approx(
        100 * diversity(["Wise is a music producer."] * 2)
    )
    # "Wise is a" (3 tokens) answers neither sub-question; a fourth token ("music") would answer the
    # job one
    assert r["cuts"]["first 3 tokens"][0]["Dmp"]["mean"] == pytest.approx(0.0)
    # an LLM judge cannot be rerun offline: Div alone is rescored, no Avg
    assert set(first[1]) == {"Div"} and "Avg_diff" not in first[1]
    assert "| llm | first sentence | n/a | n/a |" in recitation_table(r, ["lex", "llm"])


def test_recitation_cli_names_the_tokens_and_needs_the_data(tmp_path, capsys, monkeypatch):
    import benchmarks.analysis.paired as paired

    a, b, cases = _mq_reciters(tmp_path)
    for run in (a, b):
        (run / "config.json").write_text(
            json.dumps({"benchmark": "mquake-uns", "hparams": {"model_name": "tiny"}})
        )
    monkeypatch.setattr(paired, "load_cases", lambda bench, data, why: cases)
    monkeypatch.setattr(paired, "model_token_spans", lambda name: (None, f"words of {name}"))
    assert main([str(a), str(b), "--recitation", "--resamples", "100"]) == 0
    text = capsys.readouterr().out
    assert (
        "| Avg | 100.0" in text
        and "first 32 words of tiny" in text
        and "| b | first 32 tokens | 0.0 (0%)" in text
    )
    monkeypatch.undo()
    assert main([str(a), str(b), "--recitation", "--data", str(tmp_path / "nowhere")]) == 2
    assert "--recitation needs the mquake-uns data" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(a), str(b), "--recitation", "--recitation-tokens", "0"])


def test_hierarchical_bootstrap_by_hand():
    from benchmarks.analysis.paired import hierarchical_bootstrap_ci

    # two sequences whose cases agree within each: only the choice of sequences varies, so the
    # resampled means are 0 (p 1/4), 0.5 (p 1/2) and 1 (p 1/4): the 95% interval is [0, 1]
    assert hierarchical_bootstrap_ci([[0.0, 0.0], [1.0, 1.0]], resamples=4000) == (0.0, 1.0)
    assert hierarchical_bootstrap_ci([[2.0, 2.0], [2.0]]) == (2.0, 2.0)
    # one sequence in three collapsed: three draws of sequence means (0, 0, 100) reach all-100 with
    # p 1/27 > 2.5%, so the interval spans [0, 100]; resampling the 30 cases alone is far narrower
    groups = [[0.0] * 10, [0.0] * 10, [100.0] * 10]
    assert hierarchical_bootstrap_ci(groups, resamples=4000) == (0.0, 100.0)
    lo, hi = bootstrap_ci([v for g in groups for v in g], resamples=4000)
    assert 10 < lo < 100 / 3 < hi < 55


def test_hierarchical_bootstrap_of_identical_sequences_is_the_per_case_one():
    """Identical sequences have no spread between them: resampling sequences, then cases, varies as
    much as resampling all the cases at once."""
    from benchmarks.analysis.paired import hierarchical_bootstrap_ci

    seq = [0.0, 100.0, 30.0, 70.0, 50.0, 0.0, 100.0, 20.0, 90.0, 40.0]
    lo, hi = hierarchical_bootstrap_ci([seq] * 3, resamples=20000, seed=1)
    plo, phi = bootstrap_ci(seq * 3, resamples=20000, seed=1)
    assert lo < 50 < hi and abs((hi - lo) - (phi - plo)) < 0.1 * (phi - plo)
    assert abs(lo - plo) < 2 and abs(hi - phi) < 2


def test_hierarchical_bootstrap_refuses_one_sequence():
    from benchmarks.analysis.paired import (
        hierarchical_bootstrap_ci,
        sequence_differences,
        sequence_note,
    )

    with pytest.raises(ValueError, match="1 group.*no interval between groups"):
        hierarchical_bootstrap_ci([[1.0, 2.0, 3.0]])
    with pytest.raises(ValueError, match="empty group"):
        hierarchical_bootstrap_ci([[1.0], []])
    one = sequence_differences([1.0, 3.0], ["s", "s"])
    assert one == {"mean": 2.0, "per_sequence": [2.0], "ci95": None}
    assert sequence_note(one).startswith(
        "one sequence (Avg difference +2.0): no between-sequence interval exists"
    )
    # sequences in the order they first appear; their mean is the cases' mean
    two = sequence_differences([4.0, 1.0, 2.0, 3.0], [7, 3, 7, 3], resamples=500)
    assert two["per_sequence"] == [3.0, 2.0] and two["mean"] == 2.5
    assert 1.0 <= two["ci95"][0] <= 2.5 <= two["ci95"][1] <= 4.0
    assert sequence_note(two).startswith("2 sequences, Avg difference per sequence +3.0, +2.0; ")


def test_paired_adds_the_sequence_level_interval_for_continual_runs(tmp_path, capsys):
    def recs(scores, blocks):
        return [
            {"case_id": str(i), "index": i, "block": b, "Ind": s, "Cmp": s}
            for i, (s, b) in enumerate(zip(scores, blocks))
        ]

    seq = [0, 0, 1, 1]
    a = _run(tmp_path / "a", "mquake-uns", recs([0.0, 0.0, 0.0, 0.0], seq))
    b = _run(tmp_path / "b", "mquake-uns", recs([1.0, 1.0, 0.0, 0.0], seq))
    one = _run(tmp_path / "one", "mquake-uns", recs([1.0, 1.0, 0.0, 0.0], [0] * 4))
    single = _run(tmp_path / "single", "mquake-uns", recs([1.0, 0.0, 0.0, 0.0], [None] * 4))
    r = paired_report(a, b, resamples=1000)
    assert r["metrics"]["Avg"]["sequences"] == {
        "mean": 50.0,
        "per_sequence": [100.0, 0.0],
        "ci95": [0.0, 100.0],
    }
    assert main([str(a), str(b), "--resamples", "1000"]) == 0
    assert (
        "Continual editing, the cases' sequences: Avg, b - a: 2 sequences, Avg difference per "
        "sequence +100.0, +0.0; sequences, then cases within them, resampled: +50.0 [+0.0, +100.0]"
    ) in capsys.readouterr().out
    # a single-editing run against a continual one: the continual run's sequences
    assert paired_report(single, b)["metrics"]["Avg"]["sequences"]["per_sequence"] == [50.0, 0.0]
    # two single-editing runs: no sequences; two runs cut into other sequences: said so
    assert "sequences" not in paired_report(single, single)["metrics"]["Avg"]
    assert main([str(a), str(one), str(single), "--resamples", "200"]) == 0
    out = capsys.readouterr().out
    assert "- one - a: the two runs edited these cases in different sequences" in out
    assert "- single - a: 2 sequences, Avg difference per sequence +50.0, +0.0;" in out
