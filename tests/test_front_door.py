"""The front door: every bad input a user can give an entry point fails in ONE line, before any edit.

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
from benchmarks.compare import compare_main
from benchmarks.runner import cli_main
from hpse_easyedit.cli import main as edit_main
from tiny_models import make_tiny_model_and_tokenizer

REPO = Path(__file__).resolve().parents[1]
needs_data = pytest.mark.skipif(not DATA_DIR.is_dir(), reason="needs ../shared/data next to the repository")

TINY = """alg_name: HPSE
model_name: {model}
rounds: 1
inner_steps: 1
max_new_tokens: 4
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("front")
    make_tiny_model_and_tokenizer("llama", root / "model")
    (root / "hpse.yaml").write_text(TINY.format(model=root / "model"))
    (root / "passage.txt").write_text("AJ Lee speaks Russian fluently.")
    (root / "empty.txt").write_text("  \n")
    (root / "a_file").write_text("not a directory")
    (root / "broken.yaml").write_text("alg_name: HPSE\nmodel_name: [unclosed\n")
    (root / "no_alg.yaml").write_text(f"model_name: {root / 'model'}\n")
    (root / "rome.yaml").write_text(f"alg_name: ROME\nmodel_name: {root / 'model'}\n")
    (root / "unke.yaml").write_text(f"alg_name: UnKE\nmodel_name: {root / 'model'}\nlayers: [0]\nv_loss_layer: 1\n")
    return root


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
    """The error lines a user saw: ERROR log records (the runner logs its one line) and stderr lines, less
    transformers' weight-loading progress bar (shown when the check needs the loaded model)."""
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and "Loading weights" not in line]
    caplog.clear()
    return logged + err


# Each entry: (id, argv after the fixed part, fragment of the one line, does the model load before the check?)
RUNNER_CASES = [
    ("limit-0", ["--limit", "0"], "--limit must be >= 1", False),
    ("limit-negative", ["--limit", "-3"], "--limit must be >= 1", False),
    ("sequential-0", ["--sequential", "0"], "--sequential must be >= 1", False),
    ("batch-size-0", ["--batch-size", "0"], "--batch-size must be >= 1", False),
    ("max-new-tokens-0", ["--max-new-tokens", "0"], "--max-new-tokens must be >= 1", False),
    ("out-is-a-file", ["--out", "{root}/a_file"], "is a file, not a directory", False),
    ("cases-unknown", ["--cases", "99999"], "--cases: no case_id 99999", False),
    ("cases-empty", ["--cases", ","], "--cases names no case id", False),
    ("cases-with-sequential", ["--cases", "1", "--sequential", "2"], "--cases picks single cases", False),
    ("data-missing", ["--data", "{root}/no-such-dir"], "no such directory", False),
    ("mquake-file-missing", ["--mquake-file", "nope.json"], "--mquake-file", False),
    ("cache-dir-is-a-file", ["--cache-dir", "{root}/a_file"], "--cache-dir", False),
    ("dist-timeout-0", ["--dist-timeout-hours", "0"], "--dist-timeout-hours must be > 0", False),
    ("hparams-missing", ["--hparams", "{root}/nope.yaml"], "no such hparams file", False),
    ("hparams-broken-yaml", ["--hparams", "{root}/broken.yaml"], "not valid YAML", False),
    ("hparams-no-alg-name", ["--hparams", "{root}/no_alg.yaml"], "needs a top-level 'alg_name'", False),
    ("hparams-unknown-alg", ["--hparams", "{root}/rome.yaml"], "alg_name 'ROME' is not a method the runner knows", False),
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
    ("model-not-found", ["--set", "model_name=no-such-org/no-such-model"], "'no-such-org/no-such-model'", True),
    ("target-modules-typo", ["--set", "target_modules=[q_projx]"], "key 'target_modules' names ['q_projx']", True),
    ("layers-out-of-range", ["--set", "layers=[99]"], "key 'layers' is [99]", True),
    ("ftm-layer-out-of-range", ["--set", "executor=ft_m", "--set", "ftm_layer=99"], "'ftm_layer'", True),
]
if not torch.cuda.is_available():
    RUNNER_CASES.append(("device-0-without-cuda", ["--set", "device=0"], "key 'device' is 0", True))
UNKE_CASES = [
    ("judge-llm-without-endpoint", ["--judge", "llm"], "no judge endpoint", False),
    ("judge-unreachable", ["--judge", "llm", "--judge-base-url", "http://127.0.0.1:9/v1"], "is unreachable", False),
    ("mmlu-every-0", ["--mmlu-every", "0"], "--mmlu-every must be >= 1", False),
    ("mmlu-n-negative", ["--mmlu-n", "-1"], "--mmlu-n must be >= 0", False),
    ("judge-max-attempts-0", ["--judge-max-attempts", "0"], "--judge-max-attempts must be >= 1", False),
    ("judge-timeout-0", ["--judge-timeout", "0"], "--judge-timeout must be > 0", False),
    ("subjects-file-missing", ["--subjects-file", "{root}/nope.json"], "--subjects-file", False),
]


def _fill(argv, root):
    return [a.replace("{root}", str(root)) for a in argv]


@needs_data
@pytest.mark.parametrize("bench, extra, fragment, after_load",
                         [("mquake-uns", *c[1:]) for c in RUNNER_CASES] + [("unkebench", *c[1:]) for c in UNKE_CASES],
                         ids=[c[0] for c in RUNNER_CASES] + [c[0] for c in UNKE_CASES])
def test_runner_bad_input_is_one_line_and_exit_2_before_any_edit(tiny, tmp_path, monkeypatch, caplog, capsys,
                                                                  bench, extra, fragment, after_load):
    if not after_load:
        _no_model_load(monkeypatch)
    out = tmp_path / "run"
    argv = ["--hparams", str(tiny / "hpse.yaml"), "--data", str(DATA_DIR), "--limit", "2", "--out", str(out),
            "--mmlu-n", "0", "--judge", "lexical"] if bench == "unkebench" else [
            "--hparams", str(tiny / "hpse.yaml"), "--data", str(DATA_DIR), "--limit", "2", "--out", str(out)]
    caplog.set_level(logging.INFO)
    assert cli_main(bench, argv + _fill(extra, tiny)) == 2
    lines = _error_lines(caplog, capsys)
    assert len(lines) == 1 and fragment in lines[0], lines
    assert "Traceback" not in lines[0]
    assert not (out / "results.jsonl").exists()  # no edit ran


@needs_data
@pytest.mark.parametrize("argv, fragment", [
    (["--log-level", "LOUD"], "argument --log-level: invalid choice"),
    (["--limit", "abc"], "argument --limit: invalid int value"),
])
def test_runner_option_syntax_errors_are_one_line(tiny, capsys, argv, fragment):
    with pytest.raises(SystemExit) as exit_:
        cli_main("mquake-uns", ["--hparams", str(tiny / "hpse.yaml")] + argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0] and "--help" in err[0]


@needs_data
def test_run_compare_checks_every_method_before_the_first_row(tiny, tmp_path, monkeypatch, caplog, capsys):
    """A bad second method stops the comparison before the first method's row edits anything."""
    _no_model_load(monkeypatch)
    monkeypatch.delenv("EASYEDIT_SRC", raising=False)
    out = tmp_path / "cmp"
    base = ["--benchmark", "mquake-uns", "--limit", "1", "--data", str(DATA_DIR), "--out", str(out),
            "--method", "LoRA", str(tiny / "hpse.yaml"), "kl_weight=0"]
    assert compare_main(base + ["--method", "HPSE", str(tiny / "hpse.yaml"), "tau=-1"]) == 2
    lines = _error_lines(caplog, capsys)
    assert len(lines) == 1 and "key 'tau' must be >= 0.0" in lines[0]
    assert compare_main(base + ["--method", "broken", str(tiny / "broken.yaml")]) == 2
    lines = _error_lines(caplog, capsys)
    assert len(lines) == 1 and "not valid YAML" in lines[0]
    import importlib.util

    if importlib.util.find_spec("easyeditor") is None:  # UnKE runs EasyEdit's code: refused up front without it
        caplog.clear()
        assert compare_main(base + ["--method", "UnKE", str(tiny / "unke.yaml")]) == 2
        lines = _error_lines(caplog, capsys)
        assert len(lines) == 1 and "EasyEdit is not importable" in lines[0]
    assert not list(out.rglob("results.jsonl"))


@pytest.mark.parametrize("extra, fragment", [
    (["--passage-file", "{root}/missing.txt"], "--passage-file {root}/missing.txt: no such file"),
    (["--passage-file", "{root}/empty.txt"], "the file is empty"),
    (["--passage-file", "{root}/passage.txt", "--save", "{root}/a_file"], "--save {root}/a_file: is a file"),
    (["--passage-file", "{root}/passage.txt", "--max-answer-tokens", "0"], "--max-answer-tokens must be >= 1"),
    (["--passage-file", "{root}/passage.txt", "--set", "kappa=1.5"], "key 'kappa' must be < 1.0"),
    (["--passage-file", "{root}", "--subject", "B"], "is a directory, not a file"),
], ids=["passage-missing", "passage-empty", "save-is-a-file", "max-answer-tokens-0", "kappa-1.5", "passage-is-dir"])
def test_edit_cli_bad_input_is_one_line_before_loading(tiny, monkeypatch, capsys, extra, fragment):
    _no_model_load(monkeypatch)
    argv = ["edit", "--hparams", str(tiny / "hpse.yaml"), "--subject", "AJ Lee"] + _fill(extra, tiny)
    if "--subject" in extra:
        argv = ["edit", "--hparams", str(tiny / "hpse.yaml")] + _fill(extra, tiny)
    assert edit_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and _fill([fragment], tiny)[0] in err[0], err


def test_edit_cli_refuses_another_methods_file(tiny, monkeypatch, capsys):
    _no_model_load(monkeypatch)
    assert edit_main(["edit", "--hparams", str(tiny / "unke.yaml"), "--subject", "AJ Lee",
                      "--passage-file", str(tiny / "passage.txt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "alg_name must be 'HPSE'" in err[0]


# ---------------------------------------------------------------------------------------------- subprocesses
def _run(args, tmp_path, **env):
    full = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "HPSE_JUDGE_", "HPSE_DEBUG"))}
    full.update(HF_HUB_OFFLINE="1", HPSE_CACHE_DIR=str(tmp_path / "cache"), NO_PROXY="127.0.0.1,localhost", **env)
    return subprocess.run([sys.executable, *args], cwd=REPO, env=full, capture_output=True, text=True, timeout=300)


@needs_data
def test_scripts_print_one_line_and_exit_2_and_debug_shows_the_traceback(tiny, tmp_path):
    out = tmp_path / "run"
    args = [str(REPO / "run_examples" / "run_hpse_unkebench.py"), "--hparams", str(tiny / "hpse.yaml"),
            "--data", str(DATA_DIR), "--limit", "1", "--out", str(out), "--judge", "llm",
            "--judge-base-url", "http://127.0.0.1:9/v1"]
    done = _run(args, tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert "judge endpoint http://127.0.0.1:9/v1 is unreachable" in lines[0] and "--judge lexical" in lines[0]
    assert not out.exists() or not (out / "results.jsonl").exists()
    debug = _run(args + ["--debug"], tmp_path)
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "JudgeError" in debug.stderr


def test_module_entry_points_print_one_line_and_exit_2(tiny, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"alg_name: HPSE\nmodel_name: {tiny / 'model'}\ntau: -3\n")
    for args, fragment in [
        (["-m", "hpse_easyedit", "edit", "--hparams", str(tiny / "hpse.yaml"), "--subject", "A",
          "--passage-file", str(tmp_path / "missing.txt")], "no such file"),
        (["-m", "hpse_easyedit.demo", "--hparams", str(bad)], "key 'tau' must be >= 0.0"),
    ]:
        done = _run(args, tmp_path)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and fragment in lines[0], done.stderr
        assert "Traceback" not in done.stderr
