"""Stored rollouts and the HTML report: two tiny real runs (one without rollouts), the report's
structure read back with html.parser, the command line's errors, and a headless-Chromium screenshot
when it is installed."""

import json
import shutil
import subprocess
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from bench_helpers import DATA_DIR, isolate_judge_env
from benchmarks.records.rollouts import pack_rollout, unpack_gaps, unpack_rollout
from benchmarks.report.__main__ import main as report_main
from benchmarks.report.html import rollout_html, write_html_report
from benchmarks.run.runner import RunOptions, run_benchmark

needs_data = pytest.mark.skipif(
    not DATA_DIR.is_dir(), reason="needs ../shared/data next to the repository"
)

# tau 0 / kappa 0: on a random tiny model the teacher (reading the passage) steps in on part of the
# tokens
TINY_HPARAMS = """alg_name: HPSE
model_name: {model}
rounds: 2
inner_steps: 1
max_new_tokens: 6
lr: 1.0e-3
tau: 0.0
kappa: 0.0
"""


def test_pack_and_unpack_rollouts_round_trip():
    for n in (0, 1, 7, 8, 9, 17):
        ids = [(31 * i + 5) % 400 for i in range(n)]
        mask = [i % 3 == 1 for i in range(n)]
        probs = [i / max(n, 1) for i in range(n)]
        stored = pack_rollout(ids, mask, probs)
        assert json.loads(json.dumps(stored)) == stored
        assert len(stored["stepin"]) == 2 * ((n + 7) // 8) and len(stored["teacher_p"]) == 2 * n
        got_ids, got_mask, got_p = unpack_rollout(stored)
        assert got_ids == ids and got_mask == mask
        assert all(abs(a - b) <= 0.5 / 255 + 1e-12 for a, b in zip(got_p, probs))
    with pytest.raises(ValueError, match="differ in length"):
        pack_rollout([1, 2], [True], [0.1, 0.2])
    gaps = [-20.0, -0.3, 0.0, 2.06, 2.2, 40.0]
    stored = pack_rollout([1, 2, 3, 4, 5, 6], [False] * 6, [0.5] * 6, gate_gap=gaps)
    assert unpack_gaps(stored) == [
        -16.0,
        -0.25,
        0.0,
        2.0,
        2.25,
        127 / 8,
    ]  # 1/8-nat steps, clipped to a signed byte
    assert unpack_gaps(pack_rollout([1], [True], [0.5])) == []  # not stored: none
    with pytest.raises(ValueError, match="gate margins"):
        pack_rollout([1, 2], [True, False], [0.1, 0.2], gate_gap=[1.0])
    with pytest.raises(ValueError, match="does not fit"):
        unpack_rollout({"ids": [1, 2, 3], "stepin": "ff", "teacher_p": ""})


def test_rollout_html_marks_exactly_the_stepped_in_tokens():
    stored = pack_rollout(
        [10, 11, 12, 13, 14], [False, True, True, False, True], [0.1, 0.9, 0.5, 0.2, 0.75]
    )
    out = rollout_html(stored, lambda ids: "".join(f"<{i}>" for i in ids), 'data-run="0"')
    parsed = _parse(out)
    (ro,) = parsed.rollouts
    assert ro["marks"] == [1, 2, 4] and ro["n"] == 5
    assert [t for _, t in ro["mark_text"]] == ["<11>", "<12>", "<14>"]
    assert (
        ro["text"] == "<10><11><12><13><14>"
    )  # html-escaped on the way in, whole again when parsed
    assert ro["probs"] == [
        "90",
        "50",
        "75",
    ]  # the teacher's probability of each stepped-in token, in percent


class _ReportParser(HTMLParser):
    """Cases, rollout blocks (their marked token indices, probabilities and text), images and links
    of a report."""

    def __init__(self):
        super().__init__()
        self.cases, self.rollouts, self.srcs, self.links = [], [], [], []
        self._ro, self._in_text, self._mark = None, False, None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if tag == "details" and "case" in classes:
            self.cases.append(a)
        if tag in ("img", "script") and a.get("src") is not None:
            self.srcs.append(a["src"])
        if tag in ("a", "link") and a.get("href"):
            self.links.append(a["href"])
        if tag == "div" and "ro" in classes:
            self._ro = {
                "attrs": a,
                "n": int(a["data-n"]),
                "marks": [],
                "mark_text": [],
                "probs": [],
                "gaps": [],
                "text": "",
            }
            self.rollouts.append(self._ro)
        if tag == "div" and "ro-text" in classes:
            self._in_text = True
        if self._in_text and tag == "mark":
            self._mark = int(a["data-t"])
            self._ro["marks"].append(self._mark)
            self._ro["probs"].append(a.get("data-p"))
            self._ro["gaps"].append(a.get("data-g"))
            self._ro["mark_text"].append((self._mark, ""))

    def handle_endtag(self, tag):
        if tag == "mark":
            self._mark = None
        if tag == "div" and self._in_text:  # the text div holds no div, so this closes it
            self._in_text, self._ro = False, None

    def handle_data(self, data):
        if self._in_text:
            self._ro["text"] += data
            if self._mark is not None:
                i, t = self._ro["mark_text"][-1]
                self._ro["mark_text"][-1] = (i, t + data)


def _parse(text):
    p = _ReportParser()
    p.feed(text)
    p.close()
    return p


@pytest.fixture(scope="module")
def tiny_runs(tiny_model, tmp_path_factory):
    """Two tiny real MQuAKE-uns runs on the same 2 cases: plain LoRA (kl_weight 0, no rollouts) and
    HPSE (and two more). Four runner runs end to end: the tests that read them are slow."""
    if not DATA_DIR.is_dir():
        pytest.skip("needs ../shared/data next to the repository")
    root = tmp_path_factory.mktemp("html")
    (root / "hpse.yaml").write_text(TINY_HPARAMS.format(model=tiny_model))
    mp = pytest.MonkeyPatch()
    isolate_judge_env(mp, root)
    try:
        common = dict(
            benchmark="mquake-uns",
            hparams=str(root / "hpse.yaml"),
            data_dir=str(DATA_DIR),
            limit=2,
            max_new_tokens=6,
            batch_size=4,
            judge="lexical",
        )
        run_benchmark(
            RunOptions(
                **common, overrides=["kl_weight=0"], out_dir=str(root / "lora"), label="LoRA"
            )
        )
        run_benchmark(RunOptions(**common, out_dir=str(root / "hpse"), label="LoRA + HPSE"))
        run_benchmark(
            RunOptions(**common, out_dir=str(root / "hpse-nostore"), store_rollouts=False)
        )
        run_benchmark(
            RunOptions(**{**common, "benchmark": "unkebench"}, mmlu_n=0, out_dir=str(root / "unke"))
        )
    finally:
        mp.undo()
    return root


def _records(run_dir):
    return [json.loads(x) for x in (Path(run_dir) / "results.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_runner_stores_each_rounds_rollouts_consistent_with_the_round_statistics(tiny_runs):
    recs = _records(tiny_runs / "hpse")
    assert len(recs) == 2
    total_in = 0
    for rec in recs:
        assert len(rec["rollouts"]) == len(rec["rounds"]) == 2
        for stats, requests in zip(rec["rounds"], rec["rollouts"]):
            assert len(requests) == len(
                rec["subjects"]
            )  # one rollout per request, in the subjects' order
            unpacked = [unpack_rollout(s) for s in requests]
            n_tokens = sum(len(ids) for ids, _, _ in unpacked)
            n_in = sum(sum(mask) for _, mask, _ in unpacked)
            total_in += n_in
            assert stats["rollout_len"] == pytest.approx(n_tokens / len(requests))
            assert stats["stepin_rate"] == pytest.approx(n_in / n_tokens)
            for _, mask, probs in unpacked:
                assert all(0.0 <= p <= 1.0 for p in probs) and len(probs) == len(mask)
            for stored in (
                requests
            ):  # tau 0, kappa 0: the teacher stepped in exactly where its margin was > 0
                gaps, (_, mask, _) = unpack_gaps(stored), unpack_rollout(stored)
                assert len(gaps) == len(mask)
                assert all(g >= -1 / 16 if m else g <= 1 / 16 for g, m in zip(gaps, mask))
    assert total_in > 0  # tau 0 / kappa 0: the teacher stepped in somewhere
    assert all(
        "rollouts" not in r for r in _records(tiny_runs / "lora")
    )  # kl_weight 0: no rollout drawn
    nostore = _records(tiny_runs / "hpse-nostore")
    assert all("rollouts" not in r for r in nostore)
    assert [r["answers"] for r in nostore] == [
        r["answers"] for r in recs
    ]  # storing changes nothing else


@pytest.mark.slow
def test_html_report_has_every_case_and_step_in_spans_matching_the_stored_masks(
    tiny_runs, tiny_model, tmp_path
):
    from transformers import AutoTokenizer

    out = write_html_report(
        [tiny_runs / "lora", tiny_runs / "hpse"],
        tmp_path / "r.html",
        data_dir=DATA_DIR,
        resamples=200,
    )
    text = out.read_text(encoding="utf-8")
    page = _parse(text)
    lora, hpse = _records(tiny_runs / "lora"), _records(tiny_runs / "hpse")
    assert [c["data-case"] for c in page.cases] == [r["case_id"] for r in hpse]
    # per case: the per-run Avg the filters use, and whether the runs disagree
    for case, a, b in zip(page.cases, lora, hpse):
        avgs = [float(x) for x in case["data-avg"].split(",")]
        assert avgs == pytest.approx([(a["Ind"] + a["Cmp"]) / 2, (b["Ind"] + b["Cmp"]) / 2])
        assert case["data-disagree"] == str(int((a["Ind"], a["Cmp"]) != (b["Ind"], b["Cmp"])))
    tok = AutoTokenizer.from_pretrained(tiny_model)
    expected, rollout_of, repeated = {}, {}, 0
    for rec in hpse:  # a round whose rollouts equal the last shown round's is named, not repeated
        shown = None
        for r, requests in enumerate(rec["rollouts"], 1):
            if shown is not None and requests == rec["rollouts"][shown - 1]:
                repeated += 1
                continue
            shown = r
            expected.update(
                {(rec["case_id"], r, k): unpack_rollout(s) for k, s in enumerate(requests)}
            )
            rollout_of.update({(rec["case_id"], r, k): s for k, s in enumerate(requests)})
    assert text.count("the same rollout") == repeated
    assert all(
        ro["attrs"]["data-run"] == "1" for ro in page.rollouts
    )  # only the HPSE run stored rollouts
    assert len(page.rollouts) == len(expected)
    # rollout blocks come case by case, round by round, request by request
    for ro, (key, (ids, mask, probs)) in zip(page.rollouts, expected.items()):
        assert (int(ro["attrs"]["data-round"]), int(ro["attrs"]["data-req"])) == key[1:]
        assert ro["n"] == len(ids)
        assert ro["marks"] == [t for t, m in enumerate(mask) if m]
        for t, shown in ro["mark_text"]:
            assert shown == tok.decode([ids[t]], clean_up_tokenization_spaces=False)
        assert ro["probs"] == [f"{100 * probs[t]:.0f}" for t in ro["marks"]]
        gaps = unpack_gaps(rollout_of[key])
        assert ro["gaps"] == [f"{gaps[t]:g}" for t in ro["marks"]]  # the tau margin on hover
    # self-contained: no network, the plot inline
    assert page.srcs and all(s.startswith("data:image/png;base64,") for s in page.srcs)
    assert not [h for h in page.links if not h.startswith("#")]
    assert "http://" not in text.replace("http://www.w3.org", "") and "https://" not in text
    assert "LoRA + HPSE" in text and "Paper layout" in text and "wins / ties / losses" in text
    assert 'data-tau="0.0" data-kappa="0.0"' in text  # the gates the hover text names


@pytest.mark.slow
def test_html_report_without_tokenizer_shows_ids_and_runs_without_rollouts_render(
    tiny_runs, tmp_path
):
    out = write_html_report(
        [tiny_runs / "hpse"],
        tmp_path / "ids.html",
        data_dir=DATA_DIR,
        resamples=100,
        tokenizer=str(tmp_path / "no-such-tokenizer"),
    )
    page = _parse(out.read_text(encoding="utf-8"))
    hpse = _records(tiny_runs / "hpse")
    first_ids, first_mask, _ = unpack_rollout(hpse[0]["rollouts"][0][0])
    ro = page.rollouts[0]
    assert ro["text"] == "".join(f"\u27e8{t}\u27e9" for t in first_ids)
    assert [t for t, _ in ro["mark_text"]] == [t for t, m in enumerate(first_mask) if m]
    plain = write_html_report([tiny_runs / "lora"], tmp_path / "plain.html", resamples=100)
    page = _parse(plain.read_text(encoding="utf-8"))
    assert len(page.cases) == 2 and not page.rollouts
    off = write_html_report(
        [tiny_runs / "hpse"], tmp_path / "off.html", resamples=100, rollouts=False
    )
    assert not _parse(off.read_text(encoding="utf-8")).rollouts


@pytest.mark.slow
def test_report_command_line(tiny_runs, tmp_path, capsys):
    out = tmp_path / "sub" / "report.html"
    assert (
        report_main(
            [
                str(tiny_runs / "lora"),
                str(tiny_runs / "hpse"),
                "--html",
                str(out),
                "--resamples",
                "100",
                "--data",
                str(DATA_DIR),
            ]
        )
        == 0
    )
    assert out.is_file() and f"file://{out.resolve()}" in capsys.readouterr().out
    assert report_main([str(tiny_runs / "lora"), str(tiny_runs / "hpse")]) == 0
    table = capsys.readouterr().out
    assert "| LoRA |" in table and "| LoRA + HPSE |" in table
    for argv, needle in (
        ([str(tmp_path / "nope"), "--html", str(out)], "no config.json"),
        ([str(tiny_runs / "lora"), "--label", "a", "--label", "b"], "--label given 2 times"),
        ([str(tiny_runs / "lora"), "--html", str(tmp_path)], "is a directory"),
        ([str(tiny_runs / "lora"), "--data", str(tmp_path / "nodata")], "--data"),
    ):
        assert report_main(argv) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium_screenshot(
    page: Path, png: Path, width: int = 1400, height: int = 2000, fragment: str = "open-all"
) -> float:
    """Screenshot ``page`` with headless Chromium (no network, a throw-away profile); returns the
    seconds it took."""
    with tempfile.TemporaryDirectory() as profile:
        t0 = time.perf_counter()
        subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                f"--screenshot={png}",
                f"--window-size={width},{height}",
                f"{page.resolve().as_uri()}#{fragment}",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        return time.perf_counter() - t0


@pytest.mark.slow
@pytest.mark.skipif(
    CHROMIUM is None, reason="headless screenshot needs Chromium: apt-get install -y chromium"
)
def test_headless_chromium_renders_the_report(tiny_runs, tmp_path):
    import numpy as np
    from PIL import Image

    out = write_html_report(
        [tiny_runs / "lora", tiny_runs / "hpse"],
        tmp_path / "r.html",
        data_dir=DATA_DIR,
        resamples=100,
    )
    png = tmp_path / "shot.png"
    seconds = chromium_screenshot(out, png, height=3200)
    img = np.asarray(Image.open(png).convert("RGB"))
    assert img.shape[:2] == (3200, 1400) and seconds < 60
    orange = (
        (img[..., 0] > 240) & (abs(img[..., 1].astype(int) - 0xB3) < 12) & (img[..., 2] < 0x60)
    ).sum()
    assert (
        orange > 20
    )  # the step-in highlight (#ffb347) is on screen: the rollouts opened and rendered
    assert img.std() > 20  # not a blank page


@pytest.mark.slow
def test_questions_come_only_from_the_data_file_the_runs_recorded(
    tiny_runs, tmp_path, monkeypatch, capsys, caplog
):
    other = tmp_path / "data" / "akew"
    other.mkdir(parents=True)
    cases = json.loads((DATA_DIR / "akew" / "MQuAKE-CF.json").read_text())[:2]
    cases[0]["new_single_hops"][0]["question"] = "A question the runs never saw?"
    (other / "MQuAKE-CF.json").write_text(json.dumps(cases))
    with pytest.raises(ValueError, match="sha256 differs"):  # named with --data: an error
        write_html_report(
            [tiny_runs / "hpse"], tmp_path / "r.html", resamples=100, data_dir=tmp_path / "data"
        )
    assert (
        report_main(
            [
                str(tiny_runs / "hpse"),
                "--html",
                str(tmp_path / "r.html"),
                "--data",
                str(tmp_path / "data"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "sha256 differs" in err and len(err.strip().splitlines()) == 1
    monkeypatch.setenv(
        "HPSE_DATA_DIR", str(tmp_path / "data")
    )  # the default data directory: a warning, no questions
    with caplog.at_level("WARNING"):
        out = write_html_report([tiny_runs / "hpse"], tmp_path / "r.html", resamples=100)
    text = out.read_text(encoding="utf-8")
    assert "sha256 differs" in caplog.text
    assert "A question the runs never saw?" not in text and 'class="qa"' not in text
    assert len(_parse(text).cases) == 2


@pytest.mark.slow
def test_unkebench_cases_show_the_judges_facts_and_sub_question_verdicts(tiny_runs, tmp_path):
    import re

    out = write_html_report(
        [tiny_runs / "unke"], tmp_path / "uk.html", data_dir=DATA_DIR, resamples=100
    )
    text = out.read_text(encoding="utf-8")
    recs = _records(tiny_runs / "unke")
    chunks = text.split('<details class="case"')[1:]
    assert len(chunks) == len(recs) == 2
    for chunk, rec in zip(chunks, recs):
        assert f'data-case="{rec["case_id"]}"' in chunk
        dmp_rows = re.findall(r"sub-question \(Dmp\).*?</tr>", chunk, flags=re.S)
        assert len(dmp_rows) == len(rec["dmp_scores"])
        assert [('class="v ok"' in row) for row in dmp_rows] == [bool(v) for v in rec["dmp_scores"]]
        facts = sum(len(f["facts"]) for f in rec["factscore"])
        assert chunk.count("<li>") == facts
        assert sum(f["supported"].count(True) for f in rec["factscore"]) == len(
            re.findall(r'<li><span class="v ok">', chunk)
        )
    assert (
        "lexical-fallback is an offline word-overlap stand-in" in text
    )  # the judge note under the table


@pytest.mark.slow
@pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium needed: apt-get install -y chromium"
)
def test_filters_run_in_chromium(tiny_runs, tmp_path):
    out = write_html_report(
        [tiny_runs / "lora", tiny_runs / "hpse"],
        tmp_path / "r.html",
        data_dir=DATA_DIR,
        resamples=100,
    )
    lora, hpse = _records(tiny_runs / "lora"), _records(tiny_runs / "hpse")
    avg = [[(r["Ind"] + r["Cmp"]) / 2 for r in recs] for recs in (lora, hpse)]
    expected = {
        "all": 2,
        "disagree": sum(a != b for a, b in zip(*avg)),
        "wins&a=0&b=1": sum(b > a for a, b in zip(*avg)),
        "losses&a=0&b=1": sum(b < a for a, b in zip(*avg)),
        "wins&a=1&b=0": sum(a > b for a, b in zip(*avg)),
    }
    for mode, n in expected.items():
        with tempfile.TemporaryDirectory() as profile:
            dom = subprocess.run(
                [
                    CHROMIUM,
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--no-first-run",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    f"--user-data-dir={profile}",
                    "--dump-dom",
                    f"{out.resolve().as_uri()}#filter={mode}",
                ],
                check=True,
                capture_output=True,
                text=True,
                timeout=120,
            ).stdout
        assert f">{n} of 2 cases shown<" in dom, mode
        assert dom.count('class="case hidden"') == 2 - n
