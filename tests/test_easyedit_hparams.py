"""The baselines' hparams files and the parts of the EasyEdit integration that run without EasyEdit.

Every shipped file is checked against the facts it encodes (the backbone's depth, tied embeddings,
the paper's executor values); the adapters' pure pieces (locality data, EasyEdit's name dispatch,
the decoder-layer output shim, the restore handle and sequential reuse) run on tiny models.
"""

import json
from pathlib import Path

import pytest
import torch
import yaml

from hpse_easyedit import HParamsError, HPSEHyperParams, restore_weights
from hpse_easyedit.editor import RequestError
from hpse_easyedit.integrations import baselines as B
from hpse_easyedit.integrations.baselines import locality, unke
from hpse_easyedit.integrations.entries import EditHandle, apply_hpse_to_model
from hpse_easyedit.methods import load_hparams
from tiny_models import make_tiny_model_and_tokenizer, same_weights, tiny_hparams, weights_snapshot

REPO = Path(__file__).resolve().parents[1]
HP = REPO / "hparams"
BACKBONES = {  # file stem -> (HF id, decoder layers, tied input/output embeddings)
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B-Instruct", 28, False),
    "qwen3-8b": ("Qwen/Qwen3-8B", 36, False),
    "llama3.1-8b": ("meta-llama/Llama-3.1-8B-Instruct", 32, False),
    "gemma2-9b": ("google/gemma-2-9b-it", 42, True),
    "smollm2-135m": ("HuggingFaceTB/SmolLM2-135M-Instruct", 30, True),
}
EASYEDIT_MEMIT_KEYS = {  # easyeditor/models/memit/memit_hparams.py
    "layers",
    "layer_selection",
    "fact_token",
    "v_num_grad_steps",
    "v_lr",
    "v_loss_layer",
    "v_weight_decay",
    "clamp_norm_factor",
    "kl_factor",
    "mom2_adjustment",
    "mom2_update_weight",
    "rewrite_module_tmp",
    "layer_module_tmp",
    "mlp_module_tmp",
    "attn_module_tmp",
    "ln_f_module",
    "lm_head_module",
    "mom2_dataset",
    "mom2_n_samples",
    "mom2_dtype",
    "alg_name",
    "device",
    "model_name",
    "stats_dir",
    "max_length",
    "batch_size",
    "model_parallel",
}
EASYEDIT_ALPHAEDIT_KEYS = EASYEDIT_MEMIT_KEYS | {"nullspace_threshold", "L2", "P_loc"}


def test_every_method_has_a_file_for_the_four_backbones_and_smollm():
    for method in ("LoRA", "FT-M", "MEMIT", "AlphaEdit", "UnKE", "AnyEdit", "COIN"):
        assert {p.stem for p in (HP / method).glob("*.yaml")} == set(BACKBONES), method


@pytest.mark.parametrize("stem", sorted(BACKBONES))
@pytest.mark.parametrize("method, executor", [("LoRA", "lora"), ("FT-M", "ft_m")])
def test_plain_executor_baselines_are_the_hpse_files_with_the_kl_term_off(method, executor, stem):
    hp = HPSEHyperParams.from_hparams(HP / method / f"{stem}.yaml")
    hpse = HPSEHyperParams.from_hparams(
        HP / "HPSE" / (f"{stem}.yaml" if executor == "lora" else f"{stem}-ftm.yaml")
    )
    assert hp.executor == executor and hp.kl_weight == 0.0 and hp.nll_weight == 1.0
    assert hp.to_dict() == {**hpse.to_dict(), "kl_weight": 0.0}


@pytest.mark.parametrize("stem", sorted(BACKBONES))
@pytest.mark.parametrize("method", ["MEMIT", "AlphaEdit"])
def test_locate_then_edit_files_keep_easyedits_schema_and_fit_the_backbone(method, stem):
    name, n_layers, tied = BACKBONES[stem]
    config = yaml.safe_load((HP / method / f"{stem}.yaml").read_text())
    adapter = {
        k
        for k in config
        if k
        in {"stats_corpus", "editing_prompt", "chat_template_kwargs", "dtype", "use_chat_template"}
    }
    assert adapter == (
        {"chat_template_kwargs"} if stem == "qwen3-8b" else set()
    )  # thinking off, like every method
    assert set(config) - adapter <= (
        EASYEDIT_MEMIT_KEYS if method == "MEMIT" else EASYEDIT_ALPHAEDIT_KEYS
    )
    assert config["alg_name"] == method and config["model_name"] == name
    assert config["v_loss_layer"] == n_layers - 1 and max(config["layers"]) < n_layers
    assert config["lm_head_module"] == ("model.embed_tokens" if tied else "lm_head")
    if (
        stem == "smollm2-135m"
    ):  # offline: a local corpus, computed by hpse_easyedit.integrations.covariance
        assert config["mom2_dataset"] == "editevery" and config["device"] == "cpu"
    else:
        assert config["mom2_dataset"] == "wikipedia"


def test_alphaedit_projections_are_stored_per_model():
    """EasyEdit's default P_loc (./null_space_project.pt) would hand one model's projection to
    another."""
    locs = [
        yaml.safe_load((HP / "AlphaEdit" / f"{stem}.yaml").read_text())["P_loc"]
        for stem in BACKBONES
    ]
    assert len(set(locs)) == len(locs) and all(
        Path(p).parent.name not in ("", ".", "stats") for p in locs
    )


@pytest.mark.parametrize("stem", sorted(BACKBONES))
@pytest.mark.parametrize("method", ["UnKE", "AnyEdit"])
def test_unke_family_files_load_and_fit_the_backbone(method, stem):
    name, n_layers, tied = BACKBONES[stem]
    hp = load_hparams(HP / method / f"{stem}.yaml")
    assert (
        type(hp).__name__ == f"{method}HyperParams"
        and hp.alg_name == method
        and hp.model_name == name
    )
    assert hp.layers == [7] and hp.v_loss_layer == n_layers - 1 and hp.ex_data_num == 20
    assert hp.lm_head_module == ("model.embed_tokens" if tied else "lm_head")
    if method == "AnyEdit":
        assert (hp.window_size, hp.overlap) == (50, 0)
    for attr in (
        "alg_name",
        "model_name",
        "device",
        "model_parallel",
        "batch_size",
        "max_length",
        "fp16",
    ):
        assert hasattr(hp, attr)  # what EasyEdit's BaseEditor reads


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("alg_name: UnKE\nmodel_name: m\nlayers: []\n", "key 'layers' must not be empty"),
        (
            "alg_name: UnKE\nmodel_name: m\nlayers: [9]\nv_loss_layer: 3\n",
            "v_loss_layer (3) must be >= the rewritten layers",
        ),
        (
            "alg_name: AnyEdit\nmodel_name: m\nwindow_size: 4\noverlap: 4\n",
            "overlap (4) must be < window_size (4)",
        ),
        ("alg_name: UnKE\nmodel_name: m\nalpaca: x.json\n", "unknown key(s) ['alpaca']"),
        ("alg_name: ROME\nmodel_name: m\n", "alg_name must be one of"),
    ],
)
def test_bad_unke_files_name_the_key_and_the_file(tmp_path, text, fragment):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(HParamsError) as err:
        load_hparams(path)
    assert fragment in str(err.value) and str(path) in str(err.value)


def test_hpse_hparams_carry_what_base_editor_reads():
    hp = HPSEHyperParams(model_name="m", dtype="float16")
    assert hp.fp16 is True and HPSEHyperParams(model_name="m").fp16 is False
    for attr in (
        "alg_name",
        "model_name",
        "device",
        "model_parallel",
        "batch_size",
        "max_length",
        "use_chat_template",
    ):
        assert hasattr(hp, attr)


# ----------------------------------------------------------------------------------- adapter pieces
def test_easyedit_name_dispatch_picks_the_branch_that_fits_the_model():
    llama, _ = make_tiny_model_and_tokenizer("llama")
    gemma, _ = make_tiny_model_and_tokenizer("gemma2")
    assert (
        B.easyedit_model_name("Qwen/Qwen2.5-7B-Instruct", llama, "AlphaEdit")
        == "Qwen/Qwen2.5-7B-Instruct"
    )
    smol = B.easyedit_model_name("HuggingFaceTB/SmolLM2-135M-Instruct", llama, "AlphaEdit")
    assert "llama" in smol.lower() and smol.startswith("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert "llama" in B.easyedit_model_name("google/gemma-2-9b-it", gemma, "AlphaEdit")
    assert "Qwen2.5-7B-Instruct" in B.easyedit_model_name(
        "meta-llama/Llama-3.1-8B-Instruct", llama, "UnKE"
    )
    assert B.easyedit_model_name("x", llama, "MEMIT") == "x"
    gpt2 = torch.nn.Module()
    gpt2.config = type("C", (), {"model_type": "gpt_neox"})()
    with pytest.raises(HParamsError, match="cannot size"):
        B.easyedit_model_name("EleutherAI/pythia", gpt2, "AlphaEdit")


def test_direct_layer_calls_get_tuples_while_the_models_own_forward_is_untouched():
    model, tok = make_tiny_model_and_tokenizer("llama")
    layer = model.model.layers[0]
    ids = torch.tensor([tok.encode("AJ Lee speaks Russian.")])
    hidden = model.model.embed_tokens(ids)
    pos = torch.arange(ids.shape[1])[None]
    emb = model.model.rotary_emb(hidden, pos)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        bare = layer(hidden, position_embeddings=emb, position_ids=pos)
        with unke._tuple_layer_outputs(model, ["model.layers.0"]):
            wrapped = layer(hidden, position_embeddings=emb, position_ids=pos)
            logits_inside = model(input_ids=ids).logits
        after = layer(hidden, position_embeddings=emb, position_ids=pos)
    assert isinstance(bare, torch.Tensor) and isinstance(
        after, torch.Tensor
    )  # transformers >= 4.54
    assert isinstance(wrapped, tuple) and torch.equal(wrapped[0], bare)
    assert torch.equal(logits_inside, logits)


def test_locality_texts_from_alpaca_question_answer_and_plain_files(tmp_path):
    _, tok = make_tiny_model_and_tokenizer("llama")
    (tmp_path / "alpaca.json").write_text(
        json.dumps(
            [
                {"instruction": "Name a colour.", "input": "", "output": "Red."},
                {"instruction": "Add", "input": "1 and 2", "output": "3"},
            ]
        )
    )
    (tmp_path / "qa.jsonl").write_text(json.dumps({"question": "Q?", "answer": "A."}) + "\n")
    (tmp_path / "plain.txt").write_text("just text")
    texts = B.load_instruction_texts(
        tok, [str(tmp_path / n) for n in ("alpaca.json", "qa.jsonl", "plain.txt")]
    )
    assert (
        texts[0]
        == "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\nRed.<|im_end|>\n"
    )
    assert (
        "Add\n1 and 2" in texts[1]
        and texts[2].startswith("<|im_start|>user\nQ?")
        and texts[3] == "just text"
    )
    draw = locality._draw(texts, 2, 0, [{"target_new": "p"}])
    assert (
        draw == locality._draw(texts, 2, 0, [{"target_new": "p"}]) and len(draw) == 2
    )  # same case, same draw
    cut = locality._cut(tok, texts[0], 4)
    assert len(tok(cut, add_special_tokens=False)["input_ids"]) == 4 and texts[0].startswith(cut)
    assert (
        locality._cut(tok, texts[0], 0) == texts[0]
        and locality._cut(tok, "just text", 100) == "just text"
    )


def test_a_locality_cache_reads_each_source_set_once_and_draws_what_a_fresh_read_draws(
    tmp_path, monkeypatch
):
    _, tok = make_tiny_model_and_tokenizer("llama")
    (tmp_path / "qa.jsonl").write_text(
        "".join(json.dumps({"question": f"Q{i}?", "answer": f"A{i}."}) + "\n" for i in range(6))
    )
    (tmp_path / "plain.txt").write_text("just text")
    reads = []
    real = locality.load_instruction_texts
    monkeypatch.setattr(
        locality, "load_instruction_texts", lambda *a: reads.append(a[1]) or real(*a)
    )
    hp = B.UnKEHyperParams(
        model_name="tiny",
        layers=[0],
        v_loss_layer=1,
        ex_data=[str(tmp_path / "qa.jsonl")],
        ex_data_num=3,
        ex_data_max_tokens=4,
    )
    reqs = [{"target_new": "AJ Lee speaks Russian."}]
    cache = B.LocalityTexts()
    first = locality.draw_locality_texts(tok, hp, reqs, cache)
    assert (
        locality.draw_locality_texts(tok, hp, reqs, cache) == first and len(reads) == 1
    )  # read once
    assert (
        locality.draw_locality_texts(tok, hp, reqs) == first and len(reads) == 2
    )  # no cache: read again
    cache.texts(tok, [str(tmp_path / "plain.txt")], {})
    assert len(reads) == 3 and len(first) == 3
    assert all(len(tok(t, add_special_tokens=False)["input_ids"]) <= 4 for t in first)


def test_easyedit_caches_are_emptied_for_another_model_and_alphaedit_starts_fresh_after_a_restore():
    from types import SimpleNamespace

    from hpse_easyedit.integrations.baselines.locate_then_edit import EasyEditCaches

    memit, alpha = (
        SimpleNamespace(COV_CACHE={}),
        SimpleNamespace(COV_CACHE={}, P_loaded=True, cache_c_new=True),
    )
    caches = EasyEditCaches(memit, alpha)
    model_a, _ = make_tiny_model_and_tokenizer("llama")
    model_b, _ = make_tiny_model_and_tokenizer("llama")
    caches.reset_for(model_a)
    assert (
        not alpha.P_loaded
        and not alpha.cache_c_new
        and caches.take_fresh()
        and not caches.take_fresh()
    )
    memit.COV_CACHE["k"] = alpha.COV_CACHE["k"] = 1
    alpha.P_loaded = True
    caches.prepared.add("key")
    caches.reset_for(model_a)  # the same model: EasyEdit's caches stay
    assert (
        memit.COV_CACHE
        and alpha.P_loaded
        and caches.prepared == {"key"}
        and not caches.take_fresh()
    )
    caches.use_projection("P.pt")
    assert not alpha.P_loaded and caches.p_loc == "P.pt"
    alpha.P_loaded = True
    caches.use_projection("P.pt")  # the loaded P: kept
    assert alpha.P_loaded
    caches.reset_for(model_b)
    assert (
        not memit.COV_CACHE and not alpha.COV_CACHE and not alpha.P_loaded and not caches.prepared
    )
    assert caches.p_loc is None and caches.take_fresh()
    B.restore_copied_weights(model_b, {}, caches)
    assert caches.take_fresh()


def test_locate_then_edit_requests_are_chat_templated_with_the_passage_closed(tmp_path):
    _, tok = make_tiny_model_and_tokenizer("llama")
    hp = B.LocateThenEditHParams("MEMIT", easyedit=None, options=B.AdapterOptions())
    (req,) = B.easyedit_requests(
        tok, [{"subject": "AJ Lee", "target_new": "She speaks Russian."}], hp
    )
    assert req["prompt"] == "<|im_start|>user\nIntroduce AJ Lee.<|im_end|>\n<|im_start|>assistant\n"
    assert req["subject"] == "AJ Lee" and req["target_new"] == "She speaks Russian.<|im_end|>"
    with pytest.raises(RequestError, match="occurs 2 times"):
        B.easyedit_requests(
            tok,
            [{"prompt": "Introduce AJ Lee, AJ Lee.", "subject": "AJ Lee", "target_new": "x"}],
            hp,
        )


# ----------------------------------------------------------------------------------- restore handle
@pytest.mark.parametrize("executor", ["lora", "ft_m"])
def test_sequential_plugin_edits_on_the_bare_model_accumulate_and_handles_restore_exactly(executor):
    """BaseEditor's sequential edit passes its unwrapped model each time: the LoRA edits must land
    in one adapter."""
    model, tok = make_tiny_model_and_tokenizer("llama")
    snap = weights_snapshot(model)
    hp = tiny_hparams(executor=executor, rounds=1, inner_steps=2)
    e1, h1 = apply_hpse_to_model(
        model, tok, [{"subject": "AJ Lee", "target_new": "AJ Lee speaks Russian."}], hp
    )
    after_first = weights_snapshot(e1)
    e2, h2 = apply_hpse_to_model(
        model, tok, [{"subject": "Ellie Kemper", "target_new": "She is Croatian."}], hp
    )
    assert e2 is e1 and isinstance(h2, EditHandle) and isinstance(h2, dict)
    assert not same_weights(e2, after_first)
    h2()
    assert same_weights(e1, after_first)
    restored = h1()
    assert (
        restored is model
        and same_weights(model, snap)
        and type(model).__name__ == "LlamaForCausalLM"
    )
    # a dict like any weights_copy: restore_weights takes it too
    e3, h3 = apply_hpse_to_model(
        model, tok, [{"subject": "AJ Lee", "target_new": "AJ Lee speaks Russian."}], hp
    )
    assert same_weights(restore_weights(e3, h3), snap)


def test_covariance_statistics_that_cannot_be_had_are_refused_before_any_model_loads(
    tmp_path, monkeypatch
):
    from types import SimpleNamespace

    stats = tmp_path / "stats"
    ee = SimpleNamespace(
        mom2_dataset="wikipedia",
        mom2_n_samples=100000,
        mom2_dtype="float32",
        layers=[4, 5],
        rewrite_module_tmp="model.layers.{}.mlp.down_proj",
        stats_dir=str(stats),
    )
    hp = B.LocateThenEditHParams(
        "MEMIT", ee, B.AdapterOptions.from_dict({}, source="memit.yaml"), source="memit.yaml"
    )
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # EasyEdit could not download Wikipedia
    with pytest.raises(
        HParamsError,
        match=r"memit\.yaml: no covariance statistics for layers \[4, 5\] .*stats_corpus",
    ):
        B.check_statistics_obtainable(hp)
    folder = stats / "Some-Model" / "wikipedia_stats"
    folder.mkdir(parents=True)
    (folder / "model.layers.4.mlp.down_proj_float32_mom2_100000.npz").write_bytes(b"")
    with pytest.raises(HParamsError, match=r"layers \[5\]"):
        B.check_statistics_obtainable(hp)
    (folder / "model.layers.5.mlp.down_proj_float32_mom2_100000.npz").write_bytes(b"")
    B.check_statistics_obtainable(
        hp
    )  # computed earlier (on a machine that could download): accepted offline

    texts = tmp_path / "corpus.txt"
    texts.write_text("A local text to compute statistics from.\n")
    local = B.LocateThenEditHParams(
        "MEMIT",
        SimpleNamespace(**{**vars(ee), "stats_dir": str(tmp_path / "empty")}),
        B.AdapterOptions.from_dict({"stats_corpus": [str(texts)]}, source="memit.yaml"),
        source="memit.yaml",
    )
    B.check_statistics_obtainable(local)  # computable offline from the local corpus
    local.options.stats_corpus = [str(tmp_path / "absent.txt")]
    with pytest.raises(
        HParamsError,
        match=r"memit\.yaml: the covariance statistics cannot be computed offline: .*absent\.txt",
    ):
        B.check_statistics_obtainable(local)


def test_unke_locality_data_that_cannot_be_read_is_refused_before_any_model_loads(
    tmp_path, monkeypatch
):
    path = tmp_path / "unke.yaml"
    config = yaml.safe_load((HP / "UnKE" / "smollm2-135m.yaml").read_text())
    path.write_text(yaml.safe_dump({**config, "ex_data": [str(tmp_path / "alpaca.json")]}))
    hp = load_hparams(path)
    with pytest.raises(HParamsError, match=rf"{path}: key 'ex_data': .*alpaca\.json"):
        B.check_locality_data(hp)
    (tmp_path / "alpaca.json").write_text(
        json.dumps([{"instruction": "Name a colour.", "output": "Blue."}])
    )
    B.check_locality_data(hp)  # a local file of instruction/answer pairs: accepted
    monkeypatch.setenv(
        "HPSE_DATA_DIR", str(tmp_path / "no-data")
    )  # the built-in corpus lives in the data directory
    with pytest.raises(
        HParamsError, match=r"locality source 'editevery' needs .*no-data.*HPSE_DATA_DIR"
    ):
        B.check_locality_data(load_hparams(HP / "UnKE" / "smollm2-135m.yaml"))


def test_a_memit_file_loads_its_model_the_projects_way_on_cpu(tmp_path):
    """``load_checked_model`` for a MEMIT/AlphaEdit hparams object (EasyEdit's fields plus the
    adapter's options) loads the model in the options' dtype and checks the layers it names: the
    machine check before the weights load reads the dtype the model spec carries (it once asked the
    spec for the HPSE files' ``dtype`` string, which a baseline's spec does not have)."""
    from types import SimpleNamespace

    from hpse_easyedit.integrations.factory import load_checked_model

    make_tiny_model_and_tokenizer("llama", tmp_path=tmp_path / "m")
    easyedit = SimpleNamespace(
        model_name=str(tmp_path / "m"), device="cpu", layers=[1], v_loss_layer=1
    )
    hp = B.LocateThenEditHParams("MEMIT", easyedit, B.AdapterOptions(dtype="float32"))
    model, tok = load_checked_model(hp)
    assert model.dtype == torch.float32 and model.config.num_hidden_layers == 2 and tok is not None
    easyedit.layers = [5]  # beyond the tiny model's two layers: refused before any edit
    with pytest.raises(HParamsError, match="layers"):
        load_checked_model(hp)
