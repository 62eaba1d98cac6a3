"""Against a real EasyEdit checkout ($EASYEDIT_SRC): HPSE and COIN* through BaseEditor, and one real
edit of each baseline.

Skipped, with the reason, when ``EASYEDIT_SRC`` is unset. EasyEdit is imported through
``hpse_easyedit.easyedit``: on a machine without torchvision, timm, OpenCV, PyAV, scipy or
scikit-learn (which EasyEdit imports at top level for multimodal editing and some metrics) those get
placeholders that fail when used; the text-editing chain needs ``higher einops hydra-core nltk
rouge`` installed.
"""

import importlib
import json
import logging
from pathlib import Path

import pytest
import torch
import yaml

from hpse_easyedit.integrations import baselines as B
from tiny_models import (
    CORPUS,
    changed_weights,
    make_tiny_model_and_tokenizer,
    same_weights,
    tiny_hparams,
    weights_snapshot,
)

P1 = "AJ Lee is a professional wrestler. She speaks Russian fluently."
P2 = "Ellie Kemper is a citizen of Croatia."
REQUESTS = [{"subject": "AJ Lee", "target_new": P1}, {"subject": "Ellie Kemper", "target_new": P2}]
REPO = Path(__file__).resolve().parents[1]


# fixtures he (EasyEdit through $EASYEDIT_SRC, or skip) and workdir: tests/conftest.py


# ------------------------------------------------------------------------------------- HPSE / COIN*
@pytest.mark.parametrize("executor", ["lora", "ft_m"])
def test_hpse_through_base_editor_edit_batch_sequential_and_restore(he, workdir, executor):
    from easyeditor import BaseEditor

    path = workdir / "tiny-llama"  # EasyEdit's loader picks its Llama branch by name
    make_tiny_model_and_tokenizer("llama", tmp_path=path)
    hp = tiny_hparams(model_name=str(path), executor=executor, rounds=1, inner_steps=2)
    editor = BaseEditor.from_hparams(hp)
    snap = weights_snapshot(editor.model)
    prompts, subjects = ["Introduce AJ Lee.", "Introduce Ellie Kemper."], ["AJ Lee", "Ellie Kemper"]

    metrics, edited, handle = editor.edit(
        prompts=prompts, target_new=[P1, P2], subject=subjects, sequential_edit=False
    )
    assert len(metrics) == 2 and "rewrite_acc" in metrics[0]["post"]
    assert isinstance(handle, he.EditHandle)
    assert same_weights(editor.model, snap)  # EasyEdit's own restore between and after the edits

    hp.batch_size = 2
    metrics, edited, handle = editor.batch_edit(
        prompts=prompts, target_new=[P1, P2], subject=subjects
    )
    assert len(metrics) == 2 and same_weights(editor.model, snap)

    hp.batch_size = 1
    _, e1, h1 = editor.edit(
        prompts=prompts[:1], target_new=[P1], subject=subjects[:1], sequential_edit=True
    )
    after_first = weights_snapshot(e1)
    _, e2, h2 = editor.edit(
        prompts=prompts[1:], target_new=[P2], subject=subjects[1:], sequential_edit=True
    )
    assert e2 is e1 and changed_weights(
        e2, after_first
    )  # one adapter / one matrix accumulates both edits
    h2()
    assert same_weights(e1, after_first)
    h1()
    assert same_weights(editor.model, snap)


def test_coin_and_hpse_through_make_editor_on_a_model_easyedit_cannot_load_by_name(he, workdir):
    """Gemma-2 has no branch in EasyEdit's name-based loader (and no system role): make_editor loads
    it."""
    from hpse_easyedit.coin import COINHyperParams

    model, tok = make_tiny_model_and_tokenizer("gemma2")
    snap = weights_snapshot(model)
    for hp in (
        COINHyperParams(
            model_name="google/gemma-2-9b-it", steps=2, lr=1e-2, min_chunk_tokens=2, batch_size=2
        ),
        tiny_hparams(model_name="google/gemma-2-9b-it", rounds=1, inner_steps=1, batch_size=2),
    ):
        editor = he.make_editor(hp, model, tok)
        assert editor.model_name == "google/gemma-2-9b-it" and editor.hparams is hp
        metrics, _, _ = editor.batch_edit(
            prompts=["Introduce AJ Lee.", "Introduce Ellie Kemper."],
            target_new=[P1, P2],
            subject=["AJ Lee", "Ellie Kemper"],
        )
        assert len(metrics) == 2 and same_weights(editor.model, snap)
        ids = torch.tensor([tok.encode("Introduce AJ Lee.")])
        hp.batch_size = 1  # BaseEditor.edit is single editing
        with torch.no_grad():
            before = editor.model(input_ids=ids).logits
        _, edited, handle = editor.edit(
            prompts=["Introduce AJ Lee."], target_new=[P1], subject=["AJ Lee"], sequential_edit=True
        )
        with torch.no_grad():
            assert not torch.equal(
                editor.model(input_ids=ids).logits, before
            )  # the edit lives in editor.model
        handle()
        assert same_weights(editor.model, snap)


# ---------------------------------------------------------------------------------------- baselines
def _unke_hparams(alg, tmp_path):
    import json

    ex = tmp_path / "alpaca.json"
    ex.write_text(
        json.dumps([{"instruction": c.split(".")[0], "input": "", "output": c} for c in CORPUS])
    )
    cls = B.UnKEHyperParams if alg == "UnKE" else B.AnyEditHyperParams
    extra = {"window_size": 8} if alg == "AnyEdit" else {}
    return cls(
        model_name="tiny",
        layers=[0],
        v_loss_layer=1,
        v_num_grad_steps=3,
        optim_num_step=3,
        ex_data=[str(ex)],
        ex_data_num=4,
        **extra,
    )


@pytest.mark.parametrize(
    "alg, module, fn",
    [
        ("UnKE", "easyeditor.models.unke.unke_main", "apply_unke_to_model"),
        ("AnyEdit", "easyeditor.models.unke_ARE.unke_ARE_main", "apply_unke_ARE_to_model"),
    ],
)
def test_unke_and_anyedit_run_easyedits_own_code_and_restore(
    he, workdir, monkeypatch, alg, module, fn
):
    mod = importlib.import_module(module)
    calls = []
    original = getattr(mod, fn)

    def spy(model, tok, hparams, batch_data, ex_data):
        calls.append((type(hparams).__module__, hparams.model_name, batch_data, len(ex_data)))
        return original(model, tok, hparams, batch_data, ex_data)

    monkeypatch.setattr(mod, fn, spy)
    model, tok = make_tiny_model_and_tokenizer("llama")
    snap = weights_snapshot(model)
    hp = _unke_hparams(alg, workdir)
    spec = he.get_method(alg)
    res = spec.edit(model, tok, REQUESTS, hp)
    ((ee_module, ee_name, batch, n_ex),) = calls
    assert ee_module.startswith("easyeditor.models.unke") and "Qwen2.5-7B-Instruct" in ee_name
    assert (
        batch[0]["question"]
        == "<|im_start|>user\nIntroduce AJ Lee.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert batch[1]["answer"] == P2 + "<|im_end|>" and n_ex == 4
    assert changed_weights(model, snap) and all(
        k.startswith("model.layers.0.") for k in changed_weights(model, snap)
    )
    assert {n: p.requires_grad for n, p in model.named_parameters()} == snap[1]
    spec.restore(res.model, res.weights_copy)
    assert same_weights(model, snap)

    editor = he.make_editor(hp, model, tok)  # the same method as an ALG_DICT entry of BaseEditor
    metrics, _, _ = editor.edit(prompts=["Introduce AJ Lee."], target_new=[P1], subject=["AJ Lee"])
    assert len(metrics) == 1 and len(calls) == 2 and same_weights(editor.model, snap)


def _locate_then_edit_file(alg, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(CORPUS * 3))
    config = dict(
        alg_name=alg,
        model_name="tiny-llama",
        stats_dir=str(tmp_path / "stats"),
        device="cpu",
        layers=[0, 1],
        clamp_norm_factor=4,
        layer_selection="all",
        fact_token="subject_last",
        v_num_grad_steps=3,
        v_lr=0.5,
        v_loss_layer=1,
        v_weight_decay=1e-3,
        kl_factor=0.0625,
        mom2_adjustment=True,
        mom2_update_weight=100,
        rewrite_module_tmp="model.layers.{}.mlp.down_proj",
        layer_module_tmp="model.layers.{}",
        mlp_module_tmp="model.layers.{}.mlp",
        attn_module_tmp="model.layers.{}.self_attn",
        ln_f_module="model.norm",
        lm_head_module="lm_head",
        mom2_dataset="tinycorpus",
        mom2_n_samples=1000,
        mom2_dtype="float32",
        stats_corpus=[str(corpus)],
    )
    if alg == "AlphaEdit":
        config.update(
            P_loc=str(tmp_path / "stats" / "tiny" / "P.pt"), nullspace_threshold=2e-2, L2=1
        )
    path = tmp_path / f"{alg}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("alg", ["MEMIT", "AlphaEdit"])
def test_memit_and_alphaedit_edit_offline_through_easyedits_alg_dict_and_restore(
    he, workdir, monkeypatch, alg
):
    layer_stats = importlib.import_module("easyeditor.models.rome.layer_stats")

    def no_download(*args, **kwargs):
        raise AssertionError("EasyEdit tried to download its statistics dataset")

    monkeypatch.setattr(layer_stats, "load_dataset", no_download)
    alg_dict = importlib.import_module("easyeditor.util.alg_dict").ALG_DICT
    calls = []
    original = alg_dict[alg]

    def spy(model, tok, requests, hparams, **kwargs):
        calls.append((hparams.model_name, requests, kwargs))
        return original(model, tok, requests, hparams, **kwargs)

    monkeypatch.setitem(alg_dict, alg, spy)
    model, tok = make_tiny_model_and_tokenizer("llama")
    model.config._name_or_path = "tiny-llama"
    snap = weights_snapshot(model)
    spec = he.get_method(alg)
    hp = spec.load_hparams(str(_locate_then_edit_file(alg, workdir)), ["v_num_grad_steps=2"])
    assert hp.easyedit.v_num_grad_steps == 2 and spec.hparams_dict(hp)["adapter"]["stats_corpus"]
    for _ in range(2):  # two single edits, each from the unedited model
        res = spec.edit(model, tok, REQUESTS, hp)
        assert changed_weights(model, snap) == {
            "model.layers.0.mlp.down_proj.weight",
            "model.layers.1.mlp.down_proj.weight",
        }
        spec.restore(res.model, res.weights_copy)
        assert same_weights(model, snap)
    assert all(req["target_new"].endswith("<|im_end|>") for req in calls[0][1])
    assert (workdir / "stats" / "tiny-llama" / "tinycorpus_stats").is_dir()
    if alg == "AlphaEdit":
        assert "llama" in calls[0][0].lower()  # the name EasyEdit's AlphaEdit sizes P by
        assert [c[2].get("reset_cache") for c in calls] == [
            True,
            True,
        ]  # cache_c fresh for every single edit
        assert (workdir / "stats" / "tiny" / "P.pt").is_file() and not (
            workdir / "null_space_project.pt"
        ).exists()


def test_shipped_memit_and_alphaedit_files_load_with_easyedits_own_classes(he):
    from easyeditor import AlphaEditHyperParams, MEMITHyperParams

    for alg, cls in (("MEMIT", MEMITHyperParams), ("AlphaEdit", AlphaEditHyperParams)):
        for path in sorted((REPO / "hparams" / alg).glob("*.yaml")):
            ours = he.load_hparams(path)
            assert type(ours.easyedit) is cls and ours.alg_name == alg
            if path.stem != "qwen3-8b":  # the one file with an adapter key (thinking off)
                theirs = cls.from_hparams(str(path))
                assert theirs == ours.easyedit


def test_the_benchmark_runner_takes_every_method_by_its_hparams_file(he):
    from benchmarks.run.methods import method_for_file

    for method, name in (
        ("LoRA", "HPSE"),
        ("FT-M", "HPSE"),
        ("COIN", "COIN"),
        ("MEMIT", "MEMIT"),
        ("AlphaEdit", "AlphaEdit"),
        ("UnKE", "UnKE"),
        ("AnyEdit", "AnyEdit"),
    ):
        path = REPO / "hparams" / method / "smollm2-135m.yaml"
        editor = method_for_file(path)
        hp = editor.load_hparams(str(path), [])
        assert (
            editor.name == name
            and editor.hparams_dict(hp)["model_name"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
        )


def test_run_compare_refuses_statistics_it_cannot_have_before_the_first_row(
    he, workdir, data_dir, monkeypatch, caplog
):
    """MEMIT on a dataset EasyEdit downloads, no statistics in stats_dir, offline: one line, exit 2,
    nothing edited."""
    from benchmarks.analysis.compare import compare_main

    make_tiny_model_and_tokenizer("llama", tmp_path=workdir / "tiny-llama")
    config = yaml.safe_load(_locate_then_edit_file("MEMIT", workdir).read_text())
    config.pop("stats_corpus")
    (workdir / "wiki.yaml").write_text(
        yaml.safe_dump(
            {**config, "model_name": str(workdir / "tiny-llama"), "mom2_dataset": "wikipedia"}
        )
    )
    hpse = {
        "alg_name": "HPSE",
        "model_name": str(workdir / "tiny-llama"),
        "device": "cpu",
        "rounds": 1,
        "inner_steps": 1,
    }
    (workdir / "hpse.yaml").write_text(yaml.safe_dump(hpse))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = [
        "--benchmark",
        "mquake-uns",
        "--limit",
        "1",
        "--data",
        str(data_dir),
        "--out",
        str(workdir / "cmp"),
        "--method",
        "LoRA",
        str(workdir / "hpse.yaml"),
        "kl_weight=0",
        "--method",
        "MEMIT",
        str(workdir / "wiki.yaml"),
    ]
    caplog.clear()
    assert compare_main(argv) == 2
    err = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert (
        len(err) == 1
        and "wiki.yaml: no covariance statistics for layers [0, 1]" in err[0]
        and "stats_corpus" in err[0]
    )
    assert not list((workdir / "cmp").rglob("results.jsonl"))  # the LoRA row did not run either


def test_side_by_side_comparison_of_every_method_on_a_tiny_model(he, workdir, data_dir, capsys):
    """run_compare puts LoRA, LoRA+HPSE, FT-M, FT-M+HPSE, MEMIT, AlphaEdit, UnKE, AnyEdit and COIN*
    in one table."""
    from benchmarks.analysis.compare import compare_main

    model_dir = workdir / "tiny-llama"
    make_tiny_model_and_tokenizer("llama", tmp_path=model_dir)
    files = {}
    base = dict(model_name=str(model_dir), device="cpu", max_length=1024)
    hpse = {
        **base,
        "alg_name": "HPSE",
        "ftm_layer": 1,
        "rounds": 1,
        "inner_steps": 1,
        "max_new_tokens": 4,
        "lr": 1e-2,
    }
    files["hpse"] = hpse
    files["coin"] = {**base, "alg_name": "COIN", "steps": 1, "min_chunk_tokens": 2}
    for alg in ("UnKE", "AnyEdit"):
        hp = _unke_hparams(alg, workdir).to_dict()
        files[alg] = {**hp, **base, "v_num_grad_steps": 1, "optim_num_step": 1}
    for alg in ("MEMIT", "AlphaEdit"):
        config = yaml.safe_load(_locate_then_edit_file(alg, workdir).read_text())
        files[alg] = {**config, "model_name": str(model_dir), "v_num_grad_steps": 1}
    for name, config in files.items():
        (workdir / f"{name}.yaml").write_text(yaml.safe_dump(config))
    methods = [
        ["LoRA", "hpse.yaml", "kl_weight=0"],
        ["LoRA + HPSE", "hpse.yaml"],
        ["FT-M", "hpse.yaml", "kl_weight=0", "executor=ft_m"],
        ["FT-M + HPSE", "hpse.yaml", "executor=ft_m"],
        ["MEMIT", "MEMIT.yaml"],
        ["AlphaEdit", "AlphaEdit.yaml"],
        ["UnKE", "UnKE.yaml"],
        ["AnyEdit", "AnyEdit.yaml"],
        ["COIN*", "coin.yaml"],
    ]
    argv = [
        "--benchmark",
        "mquake-uns",
        "--limit",
        "1",
        "--max-new-tokens",
        "4",
        "--data",
        str(data_dir),
        "--out",
        str(workdir / "compare"),
        "--judge",
        "lexical",
    ]
    for m in methods:
        argv += ["--method", m[0], str(workdir / m[1]), *m[2:]]
    assert compare_main(argv) == 0
    table = (workdir / "compare" / "compare.md").read_text()
    for label, *_ in methods:
        assert f"| {label} |" in table
    # EasyEdit's own algorithm is timed inside every baseline edit that runs it; the rest is our
    # integration
    paired = (workdir / "compare" / "paired.md").read_text()
    for label in ("MEMIT", "AlphaEdit", "UnKE", "AnyEdit", "LoRA", "COIN*"):
        rec = json.loads(
            (workdir / "compare" / "mquake-uns" / label.rstrip("*") / "results.jsonl").read_text()
        )
        row = next(line for line in paired.splitlines() if line.startswith(f"| {label} |"))
        if label in ("LoRA", "COIN*"):  # this project's own editors: no EasyEdit algorithm inside
            assert "algorithm_seconds" not in rec and "EasyEdit" not in row
        else:
            assert 0 < rec["algorithm_seconds"] <= rec["edit_seconds"]
            assert "% in EasyEdit's algorithm)" in row
