"""HPSE in EasyEdit's unstructured pipeline (``examples/run_AKEW_both.py``): the entry, from_json.

The tests without EasyEdit check how ``AKEWUnifiedDataset`` items become requests and that the
script's restore (writing back the returned tensors) gives the unedited model, after which the next
edit is the edit a fresh model gets. With ``$EASYEDIT_SRC`` the script's own
``run_unstructured_editing`` runs with ``"HPSE"`` added to its ``UNSTRUCTURED_ALG_DICT``, on
EasyEdit's real ``AKEWUnifiedDataset`` over records of our UnKEBench and MQuAKE-CF files, with its
calls to ``.cuda()`` / ``.to('cuda')`` sent to the CPU, and its output is scored by EasyEdit's real
``eval_akew_unstructured``.
"""

import copy
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import torch
import yaml

from hpse_easyedit import HPSEHyperParams
from hpse_easyedit.coin import COINHyperParams
from hpse_easyedit.edit_requests import RequestError
from hpse_easyedit.hparams import HParamsError
from hpse_easyedit.integrations.baselines import (
    AnyEditHyperParams,
    LocateThenEditHParams,
    UnKEHyperParams,
)
from hpse_easyedit.integrations.unstructured import (
    apply_coin_uns_to_model,
    apply_hpse_uns_to_model,
    attach_subjects,
    uns_requests,
    user_message,
)
from tiny_models import make_tiny_model_and_tokenizer, make_tokenizer, tiny_hparams

REPO = Path(__file__).resolve().parents[1]
PASSAGE_A = "AJ Lee is a professional wrestler. She speaks Russian fluently and lives in Moscow."
PASSAGE_B = "Ellie Kemper is a citizen of Croatia, a country in Southeast Europe."
MINILM = "sentence-transformers/all-MiniLM-L6-v2"  # the script's default --model_path


def qwen_style(question: str) -> str:
    """A question as EasyEdit's AKEWUnifiedDataset writes it for a Qwen2.5-7B-Instruct name."""
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def probe_logits(model, tok) -> torch.Tensor:
    ids = torch.tensor([tok.encode("AJ Lee speaks")])
    with torch.no_grad():
        return model(input_ids=ids).logits


def script_restore(model, weights_copy) -> None:
    """run_AKEW_both.py's undo: ``nethook.get_parameter(model, k)[...] = v`` per returned tensor."""
    with torch.no_grad():
        for name, value in weights_copy.items():
            dict(model.named_parameters())[name][...] = value


# ------------------------------------------------------------------------------ items -> requests
def test_user_message_reads_the_user_turn_of_a_templated_question_and_leaves_plain_text_alone():
    chatml, gemma = make_tokenizer("qwen2"), make_tokenizer("gemma2")
    question = "What is the country of citizenship of Ellie Kemper?"
    assert user_message(chatml, qwen_style(question)) == question
    assert user_message(chatml, question) == question
    templated = gemma.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    assert templated != question and user_message(gemma, templated) == question
    assert user_message(gemma, question) == question


def test_items_become_requests_in_the_targeted_or_the_untargeted_regime():
    tok = make_tokenizer("qwen2")
    hp = tiny_hparams()
    items = [
        {
            "id": 0,
            "question": qwen_style("Which language does AJ Lee speak?"),
            "answer": PASSAGE_A + "<|im_end|>",
        },
        {
            "id": 1,
            "question": "Where is Ellie Kemper from?",
            "answer": PASSAGE_B,
            "subject": "Ellie Kemper",
        },
    ]
    targeted, untargeted = uns_requests(tok, items, hp)
    question = "Which language does AJ Lee speak?"
    assert targeted == {"prompt": question, "subject": question, "target_new": PASSAGE_A}
    assert untargeted == {"subject": "Ellie Kemper", "target_new": PASSAGE_B}
    assert items[0]["answer"].endswith("<|im_end|>")  # the script strips its own copy later
    with pytest.raises(RequestError, match=r"batch item 0 \(id 3\): 'answer' must be the passage"):
        uns_requests(tok, [{"id": 3, "question": "q?"}], hp)
    with pytest.raises(RequestError, match=r"item 0 \(id 4\): needs a 'subject' or a 'question'"):
        uns_requests(tok, [{"id": 4, "answer": PASSAGE_A}], hp)
    with pytest.raises(RequestError, match="non-empty list of AKEWUnifiedDataset items"):
        uns_requests(tok, items[0], hp)


ENTRIES = {
    "HPSE lora": (
        apply_hpse_uns_to_model,
        lambda: tiny_hparams(rounds=1, inner_steps=2, max_new_tokens=4),
    ),
    "HPSE ft_m": (
        apply_hpse_uns_to_model,
        lambda: tiny_hparams(executor="ft_m", rounds=1, inner_steps=2, max_new_tokens=4),
    ),
    "COIN*": (
        apply_coin_uns_to_model,
        lambda: COINHyperParams(
            model_name="tiny", steps=2, lr=1e-2, min_chunk_tokens=2, max_length=1024
        ),
    ),
}


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_the_scripts_restore_gives_the_unedited_model_and_the_next_edit_is_a_fresh_models(entry):
    apply, make_hparams = ENTRIES[entry]
    model, tok = make_tiny_model_and_tokenizer("llama")
    fresh = copy.deepcopy(model)
    hp = make_hparams()
    item_a = {"id": 0, "question": "Which language does AJ Lee speak?", "answer": PASSAGE_A}
    item_b = {
        "id": 1,
        "question": "Where is Ellie Kemper from?",
        "answer": PASSAGE_B,
        "subject": "Ellie Kemper",
    }
    before = probe_logits(model, tok)

    weights_copy = apply(model, tok, hp, [item_a])
    names = dict(model.named_parameters())
    assert weights_copy and set(weights_copy) <= set(names)  # named as in the script's model
    assert not torch.equal(probe_logits(model, tok), before)
    script_restore(model, weights_copy)
    assert torch.equal(probe_logits(model, tok), before)

    second = apply(model, tok, hp, [item_b])
    alone = apply(fresh, tok, hp, [item_b])
    assert set(second) == set(alone)
    edited, fresh_params = dict(model.named_parameters()), dict(fresh.named_parameters())
    assert all(torch.equal(edited[n], fresh_params[n]) for n in second)
    assert torch.equal(probe_logits(model, tok), probe_logits(fresh, tok))


# ------------------------------------------------------------------------------ from_json
def test_shipped_json_hparams_are_the_yaml_files():
    folder = REPO / "hparams" / "HPSE"
    json_files = sorted(folder.glob("*.json"))
    assert sorted(p.stem for p in json_files) == sorted(p.stem for p in folder.glob("*.yaml"))
    for path in json_files:
        from_yaml = HPSEHyperParams.from_hparams(path.with_suffix(".yaml")).to_dict()
        assert HPSEHyperParams.from_json(path).to_dict() == from_yaml, path.name


@pytest.mark.parametrize(
    "cls, folder",
    [(COINHyperParams, "COIN"), (UnKEHyperParams, "UnKE"), (AnyEditHyperParams, "AnyEdit")],
)
def test_every_hparams_class_reads_json_with_the_keys_of_its_yaml(tmp_path, cls, folder):
    yaml_path = REPO / "hparams" / folder / "smollm2-135m.yaml"
    json_path = tmp_path / "hp.json"
    json_path.write_text(json.dumps(yaml.safe_load(yaml_path.read_text())))
    assert cls.from_json(json_path).to_dict() == cls.from_hparams(yaml_path).to_dict()


def test_json_hparams_errors_are_one_line_naming_file_key_and_fix(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"alg_name": "HPSE", "model_name": "m",}')
    with pytest.raises(HParamsError, match=r"bad.json: not valid JSON \(.*\); fix the syntax"):
        HPSEHyperParams.from_json(bad)
    bad.write_text(json.dumps({"alg_name": "HPSE", "model_name": "m", "roundz": 3}))
    with pytest.raises(HParamsError, match=r"bad.json: unknown key\(s\) \['roundz'\]"):
        HPSEHyperParams.from_json(bad)
    bad.write_text(json.dumps({"alg_name": "HPSE", "model_name": "m", "tau": -1}))
    with pytest.raises(HParamsError, match=r"bad.json: key 'tau' must be >= 0.0"):
        HPSEHyperParams.from_json(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(HParamsError, match="a mapping of key: value at the top level, got list"):
        HPSEHyperParams.from_json(bad)
    with pytest.raises(
        HParamsError,
        match=r"missing.json: no such hparams file; pass the path "
        "of a JSON file",
    ):
        HPSEHyperParams.from_json(tmp_path / "missing.json")


def test_memit_json_reads_like_its_yaml(he, tmp_path):
    yaml_path = REPO / "hparams" / "MEMIT" / "smollm2-135m.yaml"
    json_path = tmp_path / "memit.json"
    json_path.write_text(json.dumps(yaml.safe_load(yaml_path.read_text())))
    from_yaml = LocateThenEditHParams.from_hparams(yaml_path).to_dict()
    assert LocateThenEditHParams.from_json(json_path).to_dict() == from_yaml


# ------------------------------------------------------------------------------ EasyEdit's script
def easyedit_data_dir(root: Path, shared: Path) -> Path:
    """The layout AKEWUnifiedDataset reads (``AKEW/MQuAKE-CF.json``, ``UnKE/final_data_v3.json``)
    over our files, and the ``alpaca_data.json`` the script opens for every method (it samples 20
    texts; only UnKE uses them)."""
    (root / "AKEW").mkdir(parents=True)
    (root / "UnKE").mkdir()
    (root / "AKEW" / "MQuAKE-CF.json").symlink_to(shared / "akew" / "MQuAKE-CF.json")
    (root / "UnKE" / "final_data_v3.json").symlink_to(shared / "unkebench" / "final_data_v2.json")
    alpaca = [
        {"instruction": f"Count to {i}.", "input": "", "output": " ".join(map(str, range(i)))}
        for i in range(20)
    ]
    (root / "alpaca_data.json").write_text(json.dumps(alpaca))
    return root


@pytest.fixture
def run_akew(he, monkeypatch):
    """EasyEdit's ``examples/run_AKEW_both.py`` as a module, its CUDA calls sent to the CPU."""
    path = Path(os.environ["EASYEDIT_SRC"]) / "examples" / "run_AKEW_both.py"
    if not path.is_file():
        pytest.skip(f"{path} is missing: this EasyEdit checkout has no examples/run_AKEW_both.py")
    saved_path = list(sys.path)
    spec = importlib.util.spec_from_file_location("run_AKEW_both", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.path[:] = saved_path  # the script appends '..'
    to = torch.Tensor.to
    monkeypatch.setattr(torch.nn.Module, "cuda", lambda self, *a, **k: self)
    monkeypatch.setattr(
        torch.Tensor,
        "to",
        lambda self, *a, **k: to(self, *("cpu" if x == "cuda" else x for x in a), **k),
    )
    return module


@pytest.fixture
def sentence_encoder(he, monkeypatch):
    """The MiniLM model of eval_akew_unstructured's last score when it is on this machine, else a
    stand-in whose score is not asserted (test_minilm_similarity_score covers it, or says why)."""
    from easyeditor.evaluate import evaluate_uns

    if minilm_path() is not None:
        return minilm_path()

    class BagOfBytes:
        def __init__(self, *args, **kwargs):
            pass

        def encode(self, sentences, convert_to_tensor=True, show_progress_bar=False):
            counts = [
                torch.bincount(torch.tensor(list(s.encode()) or [0]), minlength=256)
                for s in sentences
            ]
            return torch.stack(counts).float()

    monkeypatch.setattr(evaluate_uns, "SentenceTransformer", BagOfBytes)
    return MINILM


def minilm_path() -> str | None:
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(MINILM, local_files_only=True)
    except Exception:
        return None


@pytest.mark.parametrize(
    "data_type, executor, model_dir",
    [
        ("mquake", "lora", "Qwen2.5-7B-Instruct"),  # by this name EasyEdit templates the questions
        ("unke", "ft_m", "tiny-llama"),
    ],
)
def test_run_akew_both_with_the_hpse_line_restores_and_is_scored_by_easyedit(
    he, run_akew, sentence_encoder, data_dir, workdir, monkeypatch, data_type, executor, model_dir
):
    from easyeditor.evaluate.evaluate_uns import eval_akew_unstructured

    model_path = workdir / model_dir
    original, tok = make_tiny_model_and_tokenizer("llama", tmp_path=model_path)
    hp_path = workdir / "hpse.json"
    hp = tiny_hparams(
        model_name=str(model_path),
        executor=executor,
        rounds=1,
        inner_steps=2,
        max_new_tokens=4,
        max_length=4096,
    )
    hp_path.write_text(json.dumps(hp.to_dict()))

    calls = []

    def spied(model, tok, hparams, batch, **kwargs):
        start = probe_logits(model, tok)
        weights_copy = apply_hpse_uns_to_model(model, tok, hparams, batch, **kwargs)
        calls.append((start, probe_logits(model, tok), batch[0]["id"]))
        return weights_copy

    # the user's one line
    monkeypatch.setitem(run_akew.UNSTRUCTURED_ALG_DICT, "HPSE", (HPSEHyperParams, spied))
    args = type(
        "Args",
        (),
        dict(
            editing_method="HPSE",
            hparams_dir=str(hp_path),
            data_type=data_type,
            ds_size=2,
            data_dir=str(easyedit_data_dir(workdir / "data", data_dir)),
            sequential_edit=False,
            batch_size=1,
        ),
    )
    edited_data, model_name = run_akew.run_unstructured_editing(args)

    unedited = probe_logits(original, tok)
    assert [c[2] for c in calls] == [0, 1] and model_name == str(model_path)
    for start, after, _ in calls:
        assert torch.equal(start, unedited)  # each edit began from the unedited model (restored)
        assert not torch.equal(after, unedited)  # and the edit changed it
    assert len(edited_data) == 2
    for item in edited_data:
        assert isinstance(item["original_prediction"], str)
        assert isinstance(item["para_prediction"], str)
        assert len(item["sub_pred"]) == len(item["sub_answer"]) > 0
        assert not item["answer"].endswith("<|im_end|>")  # the script stripped its marker
    if model_dir.startswith("Qwen"):
        assert edited_data[0]["question"].startswith("<|im_start|>user\n")

    result_path = workdir / "results.json"
    result_path.write_text(json.dumps(edited_data))
    metrics = eval_akew_unstructured(str(result_path), data_type, sentence_encoder, "cpu")
    assert set(metrics) == {"Original", "Para", "Sub"}
    for part in ("Original", "Para"):
        assert {"BLEU SCORE", "ROUGE-1", "ROUGE-2", "ROUGE-L"} <= set(metrics[part])
    for part, scores in metrics.items():
        for key, value in scores.items():
            if key != "Bert Score":
                assert 0.0 <= value <= 1.0, (part, key, value)


def test_minilm_similarity_score(he, workdir):
    """eval_akew_unstructured's embedding score with the script's MiniLM model, where local."""
    path = minilm_path()
    if path is None:
        pytest.skip(
            f"{MINILM} is not in the local Hugging Face cache (offline); download it with "
            f"`hf download {MINILM}` to score with it"
        )
    from easyeditor.evaluate.evaluate_uns import eval_akew_unstructured

    record = {
        "answer": PASSAGE_A,
        "original_prediction": PASSAGE_A,
        "para_prediction": PASSAGE_B,
        "sub_pred": ["Russian"],
        "sub_answer": ["Russian"],
    }
    result_path = workdir / "results.json"
    result_path.write_text(json.dumps([record]))
    metrics = eval_akew_unstructured(str(result_path), "mquake", path, "cpu")
    assert metrics["Original"]["Bert Score"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["Para"]["Bert Score"] < metrics["Original"]["Bert Score"]


def test_attach_subjects_reads_the_records_of_easyedits_dataset(he, data_dir, workdir):
    from easyeditor import AKEWUnifiedDataset

    root = easyedit_data_dir(workdir / "data", data_dir)
    mquake = AKEWUnifiedDataset(
        str(root), dataset_type="mquake", model_name="m", size=3, use_unstructured_data=True
    )
    assert attach_subjects(mquake) == 3
    raw = json.loads((data_dir / "akew" / "MQuAKE-CF.json").read_text())
    expected = [r["requested_rewrite"][0]["subject"] for r in raw[:3]]
    assert [item["subject"] for item in mquake] == expected
    unke = AKEWUnifiedDataset(
        str(root), dataset_type="unke", model_name="m", size=2, use_unstructured_data=True
    )
    assert attach_subjects(unke) == 0
    subjects = json.loads((data_dir / "unkebench" / "subjects.json").read_text())
    assert attach_subjects(unke, subjects) == 2 and unke[0]["subject"] == subjects["0"]
    request = uns_requests(make_tokenizer("llama"), [unke[0]], tiny_hparams())[0]
    assert request == {"subject": subjects["0"], "target_new": unke[0]["answer"]}
