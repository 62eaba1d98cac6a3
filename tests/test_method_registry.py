"""The one method registry: a toy method, registered with one line, runs through the benchmark
runner, run_compare and EasyEdit's BaseEditor; every hparams file's alg_name is read by one
function."""

import json
import os
from dataclasses import dataclass

import pytest
import torch

import hpse_easyedit.methods as methods
from bench_helpers import DATA_DIR, isolate_judge_env
from hpse_easyedit import restore_weights
from hpse_easyedit.hparams import EditorHParams, HParamsError, hp_field
from hpse_easyedit.loading import load_model
from hpse_easyedit.methods import MethodSpec, hparams_dict, register_method, timed_edit
from tiny_models import make_tiny_model_and_tokenizer

WEIGHT = "model.layers.0.mlp.down_proj.weight"


# ----------------------------------------------------------------------------------- the toy method
@dataclass
class ToyHParams(EditorHParams):
    """TOY: add ``delta`` to every entry of one weight matrix."""

    ALG_NAME = "TOY"

    alg_name: str = hp_field("TOY", "Method name; must be TOY.", choices=("TOY",))
    delta: float = hp_field(1.0, "Added to every entry of the weight.")
    weight: str = hp_field(WEIGHT, "Parameter name of the weight.", nonempty=True)


CALLS: list[dict] = []  # per edit: did it start from the unedited weight, and the delta it added


def apply_toy_to_model(
    model,
    tok,
    requests,
    hparams,
    copy=False,
    return_orig_weights=False,
    keep_original_weight=False,
    **kwargs,
):
    """ROME/EasyEdit contract: ``(edited model, weights_copy)``."""
    param = model.get_parameter(hparams.weight)
    CALLS.append(
        {"start": param.detach().clone(), "delta": hparams.delta, "n_requests": len(requests)}
    )
    weights_copy = {hparams.weight: param.detach().clone()}
    with torch.no_grad():
        param.add_(hparams.delta)
    return model, weights_copy


TOY = MethodSpec(
    "TOY",
    ToyHParams.load,
    hparams_dict,
    load_model,
    timed_edit(apply_toy_to_model),
    restore_weights,
    easyedit_apply=apply_toy_to_model,
)


@pytest.fixture
def toy(monkeypatch, tmp_path):
    """TOY registered (for this test only) with its one line, a tiny model on disk and a TOY hparams
    file."""
    monkeypatch.setattr(methods, "_METHODS", dict(methods._METHODS))
    register_method(TOY)
    CALLS.clear()
    isolate_judge_env(monkeypatch, tmp_path)
    model_dir = tmp_path / "model"
    make_tiny_model_and_tokenizer("llama", model_dir)
    path = tmp_path / "toy.yaml"
    path.write_text(f"alg_name: TOY\nmodel_name: {model_dir}\ndelta: 0.25\n")
    original, _ = load_model(ToyHParams.from_hparams(path))
    return path, original.get_parameter(WEIGHT).detach().clone()


def test_the_spec_is_found_by_the_files_alg_name_and_names_its_parts(toy):
    path, _ = toy
    spec = methods.method_for_file(path)
    assert (
        spec is TOY and spec.hparams_class is ToyHParams and "TOY" in methods.registered_methods()
    )
    hp = methods.load_hparams(path, ["delta=0.5"])
    assert (
        isinstance(hp, ToyHParams) and hp.delta == 0.5 and spec.hparams_dict(hp)["weight"] == WEIGHT
    )
    assert (
        spec.edit.__wrapped__ is apply_toy_to_model
    )  # the runner's edit is the method's own function, timed


def test_every_hparams_file_is_read_by_one_function_with_one_error(tmp_path):
    from benchmarks.run.methods import method_for_file

    rome = tmp_path / "rome.yaml"
    rome.write_text("alg_name: ROME\nmodel_name: m\n")
    messages = []
    for read in (methods.method_for_file, methods.load_hparams, method_for_file):
        with pytest.raises(HParamsError) as err:
            read(rome)
        messages.append(str(err.value))
    assert (
        len(set(messages)) == 1
        and "alg_name 'ROME' is not a method the runner knows" in messages[0]
    )
    assert "alg_name must be one of" in messages[0] and "'HPSE'" in messages[0]


needs_data = pytest.mark.skipif(
    not DATA_DIR.is_dir(), reason="needs ../shared/data next to the repository"
)


@needs_data
def test_toy_method_through_the_benchmark_runner_single_and_continual(toy, tmp_path):
    from benchmarks.run.runner import RunOptions, run_benchmark

    path, original = toy
    opts = dict(
        benchmark="mquake-uns",
        hparams=str(path),
        data_dir=str(DATA_DIR),
        limit=3,
        max_new_tokens=4,
        batch_size=4,
        judge="lexical",
    )
    single = run_benchmark(RunOptions(out_dir=str(tmp_path / "single"), **opts))
    assert (
        single["n_cases"] == 3
        and single["hparams"]["delta"] == 0.25
        and single["hparams"]["alg_name"] == "TOY"
    )
    assert json.loads((tmp_path / "single" / "config.json").read_text())["editor"] == "TOY"
    assert [torch.equal(c["start"], original) for c in CALLS] == [
        True,
        True,
        True,
    ]  # restored after every case
    recs = [json.loads(x) for x in (tmp_path / "single" / "results.jsonl").read_text().splitlines()]
    assert len(recs) == 3 and all(len(r["answers"]["multi_hop"]) == 3 for r in recs)

    CALLS.clear()
    run_benchmark(RunOptions(out_dir=str(tmp_path / "seq"), sequential=2, **opts))
    # block 0: unedited, then on top of the first edit; block 1 starts from the unedited weight
    # again
    assert [torch.equal(c["start"], original) for c in CALLS] == [True, False, True]
    assert torch.allclose(CALLS[1]["start"], original + 0.25)


@needs_data
def test_toy_method_through_run_compare(toy, tmp_path, capsys):
    from benchmarks.analysis.compare import compare_main

    path, _ = toy
    out = tmp_path / "cmp"
    argv = [
        "--benchmark",
        "mquake-uns",
        "--limit",
        "1",
        "--max-new-tokens",
        "4",
        "--out",
        str(out),
        "--data",
        str(DATA_DIR),
        "--log-level",
        "WARNING",
        "--method",
        "Toy",
        str(path),
        "--method",
        "Toy x4",
        str(path),
        "delta=1.0",
    ]
    assert compare_main(argv) == 0
    table = (out / "compare.md").read_text()
    assert [line.split("|")[1].strip() for line in table.splitlines()[2:]] == ["Toy", "Toy x4"]
    summaries = json.loads((out / "compare.json").read_text())
    assert summaries["Toy"]["mquake-uns"]["hparams"]["delta"] == 0.25
    assert summaries["Toy x4"]["mquake-uns"]["hparams"]["delta"] == 1.0
    assert sorted(c["delta"] for c in CALLS) == [0.25, 1.0]


def test_toy_method_through_easyedits_base_editor(toy, monkeypatch):
    if not os.environ.get("EASYEDIT_SRC"):
        pytest.skip(
            "EASYEDIT_SRC is not set: point it at an EasyEdit source checkout to run the toy "
            "method through EasyEdit's BaseEditor"
        )
    import importlib

    import hpse_easyedit.easyedit as he

    path, original = toy
    alg_dict = importlib.import_module("easyeditor.util.alg_dict").ALG_DICT
    monkeypatch.setitem(alg_dict, "TOY", None)  # removed again after the test
    he.register()
    from easyeditor import BaseEditor
    from easyeditor.editors.batch_editor import BatchEditor

    assert alg_dict["TOY"] is apply_toy_to_model and BatchEditor.is_batchable_method("TOY")
    editor = BaseEditor.from_hparams(ToyHParams.from_hparams(path))  # routed through make_editor
    metrics, edited, _ = editor.edit(
        prompts=["Introduce AJ Lee."], target_new=["AJ Lee speaks Russian."], subject=["AJ Lee"]
    )
    assert len(metrics) == 1 and len(CALLS) == 1 and CALLS[0]["n_requests"] == 1
    assert torch.equal(CALLS[0]["start"], original)
    assert torch.equal(edited.get_parameter(WEIGHT), original)  # EasyEdit copied weights_copy back
