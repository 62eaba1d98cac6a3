"""The 7B dress rehearsal on CPU: each shipped backbone file's real architecture (its published
config, ``hpse_easyedit/backbones/``) cut to 2 layers with random weights, in the file's dtype, runs
one HPSE edit with LoRA and with FT-M through ``apply_hpse_to_model`` (and EasyEdit's ``BaseEditor``
where EasyEdit is importable), restores bit for bit, and the graph-capturable decode gives the eager
path's greedy rollout tokens. In bfloat16 a random model's top two log-probs can tie within
rounding, and which token wins depends on the host's kernels: the decode comparison
(``tests/greedy_ties.py``) requires equal tokens and step-ins up to the first position where the
eager run's choice is within bfloat16's rounding of flipping, and the two paths' log-probs within
that rounding at every position they share. (Answers on the static path against
``model.generate`` are pinned in float32, ``tests/test_static_decode.py``.)

Only the vocabulary is shrunk (to ``VOCAB`` ids, the in-test tokenizer's): the real vocabularies'
embedding and output head are 1-2 GB per model in bfloat16, more than the 2-layer rest of the model.
The tokenizer is trained with the edit's own prompt texts (``PROMPT_TEXTS``), so they tokenize
about a word a token, as a real tokenizer's would, except the teacher's system texts with their
rules and the privileged question (``SYSTEM_TEXTS``), each one token: the teacher's prompt is then
13-15 tokens instead of 162-168 (413-495 with a byte-level tokenizer of few merges). Its prefill
through the 7B-width layers in bfloat16, which this CPU multiplies at about a quarter of its float32
rate, was most of each edit's time (34 of 43 s); shapes, dtypes and code paths are the same at any
prompt length. The random weights are drawn with std 0.05 (see ``rehearsal``)."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest
import torch

from greedy_ties import (
    assert_same_greedy,
    hybrid_margin,
    recorded_rollouts,
    rollout_decisions,
)
from hpse_easyedit import HPSEHyperParams, apply_hpse_to_model, restore_weights
from hpse_easyedit.executors import make_executor
from hpse_easyedit.planner import backbone_config
from hpse_easyedit.prompts import PRIVILEGED_QUESTION, TEACHER_STYLES, privileged_system
from hpse_easyedit.rollout import batched_hybrid_rollout
from tiny_models import make_tokenizer, same_weights, weights_snapshot

# the slow tier (`make test`, not `make test-fast`): 2-layer models at 7B-9B widths
pytestmark = pytest.mark.slow

HPSE = Path(__file__).resolve().parents[1] / "hparams" / "HPSE"
VOCAB = 1024
FILES = {"qwen2.5-7b": "qwen2", "qwen3-8b": "qwen3", "llama3.1-8b": "llama", "gemma2-9b": "gemma2"}
TINY = {"device": "cpu", "rounds": 1, "inner_steps": 1, "max_new_tokens": 3, "ftm_layer": 1}
REQUESTS = [{"subject": "AJ Lee", "target_new": "AJ Lee speaks Russian."}]
#: the texts an edit of ``REQUESTS`` prompts with: the chat templates' role names, each teacher
#: wording, the privileged question, the student's prompt (the tokenizer learns them as words; at
#: most ``VOCAB`` ids in all)
PROMPT_TEXTS = (
    ("system\nuser\nassistant\nmodel\n",)
    + tuple(
        privileged_system(style, r["subject"], [r["target_new"]])
        for r in REQUESTS
        for style in TEACHER_STYLES
    )
    + tuple(
        text
        for r in REQUESTS
        for text in (PRIVILEGED_QUESTION.format(subject=r["subject"]), f"Introduce {r['subject']}.")
    )
)
#: the teacher's system texts that carry rules (every style but ``plain``, the passage alone) and
#: the privileged question, each added to the tokenizer as one token
SYSTEM_TEXTS = tuple(
    privileged_system(style, r["subject"], [r["target_new"]])
    for r in REQUESTS
    for style in TEACHER_STYLES
    if style != "plain"
) + tuple(PRIVILEGED_QUESTION.format(subject=r["subject"]) for r in REQUESTS)


@pytest.fixture(scope="module", params=sorted(FILES))
def rehearsal(request):
    """(file stem, its hparams, the 2-layer random model of its backbone in its dtype, a
    tokenizer)."""
    from transformers import AutoModelForCausalLM

    stem = request.param
    hp = HPSEHyperParams.from_hparams(HPSE / f"{stem}.yaml")
    tok = make_tokenizer(
        FILES[stem], vocab_size=VOCAB - len(SYSTEM_TEXTS), extra_corpus=PROMPT_TEXTS
    )
    tok.add_tokens(list(SYSTEM_TEXTS))
    config = backbone_config(hp.model_name, layers=2)
    config.vocab_size = VOCAB
    assert len(tok) <= VOCAB
    # peakier next-token distributions than the published 0.02: at std 0.02 a random bfloat16
    # model's top two logits often tie within bfloat16's resolution, and greedy tokens then follow
    # rounding, not the decode path
    config.initializer_range = 0.05
    config.pad_token_id, config.bos_token_id, config.eos_token_id = (
        tok.pad_token_id,
        tok.bos_token_id,
        tok.eos_token_id,
    )
    # the model's own init (``_init_weights``: normal(0, initializer_range) for every linear layer)
    # draws every weight; torch's default init of each nn.Linear before it, overwritten unread, is
    # skipped (about a third of building ~470M bfloat16 weights here)
    with (
        torch.random.fork_rng(devices=[]),
        mock.patch.object(torch.nn.Linear, "reset_parameters", lambda self: None),
    ):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=hp.torch_dtype)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = (
        tok.eos_token_id,
        tok.pad_token_id,
    )
    model.eval()
    return stem, hp, model, tok


@pytest.mark.parametrize("executor", ["", "-ftm"])
def test_one_edit_per_executor_restores_bit_for_bit(rehearsal, executor):
    stem, _, model, tok = rehearsal
    hp = HPSEHyperParams.from_hparams(HPSE / f"{stem}{executor}.yaml").with_overrides(
        {**TINY, "model_name": stem}
    )
    before = weights_snapshot(model)
    edited, weights_copy = apply_hpse_to_model(model, tok, REQUESTS, hp)
    trained = [n for n, p in edited.named_parameters() if n in weights_copy]
    assert trained and all(
        edited.get_parameter(n).dtype == (torch.float32 if "lora_" in n else hp.torch_dtype)
        for n in trained
    )
    assert all(p.dtype == hp.torch_dtype for n, p in edited.named_parameters() if "lora_" not in n)
    assert weights_copy.result.rounds[0]["rollout_len"] > 0
    restored = restore_weights(edited, weights_copy)
    assert restored is model and same_weights(restored, before)


def test_graph_decode_gives_the_eager_tokens(rehearsal):
    stem, hp, model, tok = rehearsal
    before = weights_snapshot(model)
    ex = make_executor(model, hp.with_overrides({**TINY, "model_name": stem}))
    unedited = ex.weights_copy()  # taken before the random edit below, so the restore undoes it
    try:
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in ex.trainable_parameters():
                p.add_(torch.randn(p.shape, generator=gen).to(p.dtype) * 0.05)
        s, t = (
            tok("Introduce AJ Lee.")["input_ids"],
            tok("AJ Lee speaks Russian. Who is AJ Lee?")["input_ids"],
        )
        kw = dict(
            tau=0.5,
            kappa=0.05,
            top_k=4,
            max_new_tokens=8,
            stop_ids=[tok.eos_token_id],
            pad_id=tok.pad_token_id,
        )
        with recorded_rollouts() as logprobs:
            eager = batched_hybrid_rollout(ex.model, ex.row_switch, s, t, **kw)
            graph = batched_hybrid_rollout(
                ex.model, ex.row_switch, s, t, static_decode=True, stop_every=3, **kw
            )
        # tokens and step-ins equal up to a tie within bfloat16's rounding, log-probs within it
        assert_same_greedy(
            rollout_decisions(eager),
            rollout_decisions(graph),
            *logprobs,
            dtype=hp.torch_dtype,
            margin=hybrid_margin(kw["tau"], kw["kappa"]),
        )
    finally:
        restored = restore_weights(ex.model, unedited)
    # the module's later tests get the model as it was (no adapter left behind)
    assert restored is model and same_weights(model, before)


def test_the_card_line_through_base_editor(he, workdir, rehearsal, monkeypatch):
    """``BaseEditor.from_hparams(HPSEHyperParams.from_hparams(file))`` with the overrides a user
    gives (model path, device, layers), its model loaded as ``load_model`` would, edits and undoes
    the edit bit for bit."""
    from easyeditor import BaseEditor

    import hpse_easyedit.loading as loading

    stem, _, model, tok = rehearsal
    monkeypatch.setattr(
        loading, "load_model", lambda hp: (model, tok)
    )  # the random model in place of the hub's
    hp = HPSEHyperParams.from_hparams(HPSE / f"{stem}.yaml").with_overrides(
        {**TINY, "model_name": stem}
    )
    before = weights_snapshot(model)
    editor = BaseEditor.from_hparams(hp)
    _, edited, weights_copy = editor.edit(
        prompts=["Introduce AJ Lee."],
        target_new=[REQUESTS[0]["target_new"]],
        subject=["AJ Lee"],
        sequential_edit=True,
    )
    assert not same_weights(model, before)  # the edit is kept ...
    weights_copy()
    assert same_weights(model, before)  # ... and undone bit for bit


def test_three_requests_decode_within_the_kernel_target():
    """Qwen2.5-7B's file, LoRA, bfloat16: the three requests of a MQuAKE-uns edit decoded as one
    batch on the static path launch at most 1,200 kernels per decoded token (counted at 2 and 3
    layers on the meta device, scaled to 28), with one stop test per ``decode_stop_every`` steps."""
    from benchmarks.perf.gpu_path import decode_counts

    hp = HPSEHyperParams.from_hparams(HPSE / "qwen2.5-7b.yaml")
    counts = decode_counts(hp, static=True, requests=3)
    assert counts["layers"] == 28 and counts["ops_per_token"] <= 1200
    assert counts["host_syncs_per_token"] == pytest.approx(1 / (3 * hp.decode_stop_every))


def test_roofline_reads_every_multiplied_weight_once_per_step():
    from benchmarks.perf.gpu_path import H100, roofline

    hp = HPSEHyperParams.from_hparams(HPSE / "qwen2.5-7b.yaml")
    config = backbone_config(hp.model_name)
    line = roofline(hp)
    # untied: the input embedding is gathered (one row per token), the output head read whole
    adapters = (
        28 * 12 * (2 * (3584 + 3584) + 2 * (3584 + 512) + 3 * (3584 + 18944))
    )  # q o, k v, gate up down
    base = 7_615_616_512 - config.vocab_size * config.hidden_size
    assert line["weight_bytes_per_step"] == 2 * (base + adapters)
    assert line["bound"] == "bandwidth" and line["flops_per_step"] > 2 * 2 * base
    seconds = (line["weight_bytes_per_step"] + line["kv_cache_bytes_per_step"]) / (
        H100["bandwidth_gb_s"] * 1e9
    )
    assert line["gpu_bandwidth_floor_tok_s"] == pytest.approx(1 / seconds)


def test_the_gpu_script_runs_on_cpu(tmp_path, monkeypatch):
    """``python -m benchmarks gpu-path --device ... --profile --graphs`` end to end on a 1-layer
    SmolLM2 architecture on the CPU (its compiled decode traced by dynamo's eager backend here, and
    the captured step of the ``graphs`` edits by AOTAutograd's): the figures a lent GPU fills in,
    and the profile of a rollout token and an inner step (leaf aten ops here, kernels on a GPU)."""
    import json

    import hpse_easyedit.rollout as rollout_module
    from benchmarks.perf import gpu_path
    from hpse_easyedit import captured
    from hpse_easyedit.static_decode import compile_step

    monkeypatch.setattr(
        rollout_module, "compile_step", lambda decoder: compile_step(decoder, backend="eager")
    )
    monkeypatch.setattr(captured, "BACKEND", "aot_eager")
    monkeypatch.setattr(captured, "_COMPILED", {})
    monkeypatch.setattr(gpu_path, "ROLLOUT", 4)
    out = tmp_path / "gpu.json"
    # what the file holds after each part: a step stopped at its time limit keeps them
    written, measure = [], gpu_path.gpu_figures

    def keeping(*args, partial, **kwargs):
        def seen(figures):
            partial(figures)
            written.append(json.loads(out.read_text())["smollm2-135m"])

        return measure(*args, partial=seen, **kwargs)

    monkeypatch.setattr(gpu_path, "gpu_figures", keeping)
    assert (
        gpu_path.main(
            [
                "--hparams",
                str(HPSE / "smollm2-135m.yaml"),
                "--device",
                "cpu",
                "--layers",
                "1",
                "--vocab",
                "256",
                "--set",
                "rounds=1",
                "--set",
                "inner_steps=1",
                "--profile",
                "--graphs",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    figures = json.loads(out.read_text())["smollm2-135m"]
    assert [len(w["edit_seconds"]) for w in written] == [0, 1, 2, 3, 4, 5]
    assert all(w["partial"] and w["rollout_tok_s"] and w["roofline"] for w in written)
    assert "partial" not in figures
    assert figures["layers"] == 1 and figures["rollout_tokens"] == 4
    assert figures["gpu_rollout_tok_s"] > 0 and figures["gpu_edit_seconds"] > 0
    assert set(figures["rollout_tok_s"]) == {"dynamic", "static", "compiled"}
    assert set(figures["edit_seconds"]) == {
        "first",
        "steady",
        "graphs_first",
        "graphs_steady",
        "eager_step",
    }
    assert figures["roofline"]["gpu_bandwidth_floor_tok_s"] > 0
    profile = figures["profile"]
    assert profile["rollout_token"]["units"] == 4 and profile["inner_step"]["units"] == 2
    for part in ("rollout_token", "inner_step"):
        p = profile[part]
        assert 0 < p["busy_ms"] <= p["kernel_ms"] + 1e-9 and p["busy_ms"] <= p["wall_ms"]
        assert sum(f["kernels"] for f in p["families"].values()) == pytest.approx(p["kernels"])
        assert p["families"]["matmul"]["kernels"] > 0 and p["top"][0]["ms"] > 0
    # an inner step (forward and backward of the KL and NLL rows, then Adam) runs more ops than a
    # decoded token
    assert profile["inner_step"]["kernels"] > profile["rollout_token"]["kernels"]
