"""Offline second-moment statistics: the numbers, EasyEdit's cache naming and format, corpora,
caching."""

import json
import os
import random

import numpy as np
import pytest
import torch

from hpse_easyedit.integrations import covariance as cov
from tiny_models import CORPUS, make_tiny_model_and_tokenizer

LAYERS = ["model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"]
TEXTS = CORPUS + ["A much longer text " * 20, "short"]


def _manual(model, tok, name, texts):
    """sum k k^T of the module's input over every token, one unpadded text at a time."""
    feats = []
    module = model.get_submodule(name)
    handle = module.register_forward_pre_hook(lambda m, args: feats.append(args[0][0]))
    with torch.no_grad():
        for t in texts:
            model(input_ids=torch.tensor([tok.encode(t)]))
    handle.remove()
    rows = torch.cat(feats)
    return rows.T @ rows, rows.shape[0]


def test_second_moments_equal_the_unbatched_sum_over_every_token():
    model, tok = make_tiny_model_and_tokenizer("llama")
    moments = cov.second_moments(
        model, tok, LAYERS, TEXTS, batch_tokens=64
    )  # several padded batches
    for name in LAYERS:
        expected, n = _manual(model, tok, name, TEXTS)
        mom2, count = moments[name]
        assert count == n == sum(len(tok.encode(t)) for t in TEXTS)
        assert torch.allclose(mom2, expected, rtol=1e-4, atol=1e-5)


def test_second_moments_truncate_to_the_context_length_and_name_missing_modules():
    model, tok = make_tiny_model_and_tokenizer("llama")
    ((mom2, count),) = cov.second_moments(
        model, tok, LAYERS[:1], ["word " * 50], max_length=10
    ).values()
    assert count == 10
    with pytest.raises(AttributeError):
        cov.second_moments(model, tok, ["model.layers.9.mlp.down_proj"], TEXTS)


def test_document_selection_is_easyedits_fixed_random_subset():
    order = list(range(10))
    random.Random(1).shuffle(order)
    assert cov.select_documents(10, 4) == order[:4]
    assert cov.select_documents(10, 100) == order  # EasyEdit clamps sample_size to the corpus
    assert cov.select_documents(3, None) == [0, 1, 2]


def test_context_length_follows_layer_stats():
    model, _ = make_tiny_model_and_tokenizer("qwen2")
    assert cov.context_length(model) == 2048  # max_position_embeddings, under Qwen's 4096 cap
    model.config.max_position_embeddings = 32768
    assert cov.context_length(model) == 4096


def test_stats_file_name_and_format_are_easyedits(tmp_path):
    model, _ = make_tiny_model_and_tokenizer("llama")
    model.config._name_or_path = "/models/Qwen2.5-7B-Instruct"
    path = cov.stats_file(tmp_path, model, LAYERS[0], "editevery", "float32", 200)
    assert (
        path
        == tmp_path
        / "Qwen2.5-7B-Instruct"
        / "editevery_stats"
        / f"{LAYERS[0]}_float32_mom2_200.npz"
    )
    mom2 = torch.arange(9, dtype=torch.float32).reshape(3, 3)
    cov.write_stats_file(path, mom2, 7, 200, provenance={"corpus_sources": ["x"]})
    with np.load(path) as data:
        assert set(data.files) == {"mom2.constructor", "mom2.count", "mom2.mom2", "sample_size"}
        assert str(data["mom2.constructor"]) == "easyeditor.util.runningstats.SecondMoment()"
        assert int(data["sample_size"]) == 200
    back, count = cov.read_stats_file(path)
    assert torch.equal(back, mom2) and count == 7
    assert json.loads(path.with_suffix(".json").read_text())["corpus_sources"] == ["x"]


def test_writers_of_the_same_stats_file_at_once_do_not_collide(tmp_path, another_writer_first):
    """Two processes computing the same statistics into one cache (a run per core) each write their
    own temporary file; with one shared temporary name the second renamed the first's away
    (FileNotFoundError)."""
    path = tmp_path / "m" / "editevery_stats" / "layer_float32_mom2_200.npz"
    inner_done = another_writer_first(  # the second writer finishes in between
        lambda: cov.write_stats_file(
            path, torch.ones(2, 2), 3, 200, provenance={"corpus_sha256": "b"}
        ),
        matches=lambda src: src.endswith(".tmp.npz"),
    )
    cov.write_stats_file(path, torch.ones(2, 2), 3, 200, provenance={"corpus_sha256": "a"})
    assert inner_done
    back, count = cov.read_stats_file(path)
    assert torch.equal(back, torch.ones(2, 2)) and count == 3
    assert (
        json.loads(path.with_suffix(".json").read_text())["corpus_sha256"] == "a"
    )  # whole, the last one written
    assert sorted(f.name for f in path.parent.iterdir()) == [
        path.with_suffix(".json").name,
        path.name,
    ]


def test_load_corpus_reads_text_json_jsonl_and_directories(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("first doc\nstill first\n\nsecond doc\n")
    (tmp_path / "d" / "b.jsonl").write_text('"third"\n{"text": "fourth"}\n')
    (tmp_path / "c.json").write_text(json.dumps([{"text": "fifth"}, "sixth"]))
    assert cov.load_corpus([tmp_path / "d", str(tmp_path / "c.json")]) == [
        "first doc\nstill first",
        "second doc",
        "third",
        "fourth",
        "fifth",
        "sixth",
    ]
    with pytest.raises(cov.CorpusError, match="neither a built-in corpus"):
        cov.load_corpus(["wikipedia"])
    (tmp_path / "bad.json").write_text(json.dumps([{"body": "x"}]))
    with pytest.raises(cov.CorpusError, match="item 0 is neither a string"):
        cov.load_corpus([tmp_path / "bad.json"])
    with pytest.raises(cov.CorpusError, match="set HPSE_DATA_DIR"):
        cov.load_corpus(["editevery"], root=tmp_path)


def test_builtin_corpora_read_the_benchmark_data(data_dir):
    editevery = cov.load_corpus("editevery", data_dir)
    assert len(editevery) == 552 and editevery[0].startswith(
        "Find the sum of 100 consecutive odd numbers"
    )
    assert len(cov.load_corpus("mmlu", data_dir)) == 14042


def test_ensure_layer_stats_writes_once_and_recomputes_when_the_corpus_changes(tmp_path, caplog):
    model, tok = make_tiny_model_and_tokenizer("llama")
    model.config._name_or_path = "tiny-llama"
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(TEXTS))
    kwargs = dict(
        layers=[0, 1],
        rewrite_module_tmp="model.layers.{}.mlp.down_proj",
        stats_dir=tmp_path / "stats",
        ds_name="tinycorpus",
        sample_size=5,
        precision="float64",
        sources=[str(corpus)],
    )
    files = cov.ensure_layer_stats(model, tok, **kwargs)
    assert [f.name for f in files] == [f"{n}_float64_mom2_5.npz" for n in LAYERS]
    texts = cov.load_corpus([corpus])
    chosen = [texts[i] for i in cov.select_documents(len(texts), 5)]
    expected, n = _manual(model, tok, LAYERS[1], chosen)
    mom2, count = cov.read_stats_file(files[1])
    assert (
        mom2.dtype == torch.float64
        and count == n
        and torch.allclose(mom2.float(), expected, rtol=1e-4, atol=1e-5)
    )
    stamp = files[0].stat().st_mtime_ns
    cov.ensure_layer_stats(model, tok, **kwargs)
    assert files[0].stat().st_mtime_ns == stamp  # cached: same corpus, same documents
    corpus.write_text("\n\n".join(reversed(TEXTS)))
    cov.ensure_layer_stats(model, tok, **kwargs)
    assert files[0].stat().st_mtime_ns != stamp and "another corpus" in caplog.text
    with pytest.raises(cov.CorpusError, match="names the dataset EasyEdit downloads"):
        cov.ensure_layer_stats(model, tok, **{**kwargs, "ds_name": "wikipedia"})


# --------------------------------------------------------------------------------- against EasyEdit
@pytest.fixture(scope="module")
def easyedit():
    if not os.environ.get("EASYEDIT_SRC"):
        pytest.skip(
            "EASYEDIT_SRC is not set: point it at an EasyEdit "
            "source checkout to compare with EasyEdit's layer_stats"
        )
    from hpse_easyedit.easyedit import import_easyedit

    return import_easyedit()


def test_statistics_equal_easyedits_layer_stats_on_the_same_corpus(easyedit, tmp_path, monkeypatch):
    """EasyEdit's own layer_stats over the same local texts gives our numbers, and reads our cache
    files."""
    import importlib

    ls = importlib.import_module(
        "easyeditor.models.rome.layer_stats"
    )  # `import a.b as x` hits a star-import clash

    model, tok = make_tiny_model_and_tokenizer("llama")
    model.config._name_or_path = "tiny-llama"
    monkeypatch.setattr(ls, "load_dataset", lambda *a, **k: {"train": [{"text": t} for t in TEXTS]})
    theirs = ls.layer_stats(
        model,
        tok,
        LAYERS[0],
        tmp_path / "theirs",
        "wikitext",
        ["mom2"],
        sample_size=6,
        precision="float32",
        progress=lambda it, total=None: it,
        hparams=type("H", (), {"device": "cpu"})(),
    )
    ours = cov.ensure_layer_stats(
        model,
        tok,
        layers=[0],
        rewrite_module_tmp="model.layers.{}.mlp.down_proj",
        stats_dir=tmp_path / "ours",
        ds_name="tinycorpus",
        sample_size=6,
        precision="float32",
        sources=[_write(tmp_path, TEXTS)],
    )[0]
    mom2, count = cov.read_stats_file(ours)
    assert count == theirs.mom2.count
    assert torch.allclose(mom2, theirs.mom2.mom2, rtol=1e-4, atol=1e-5)

    def no_download(*args, **kwargs):
        raise AssertionError("EasyEdit tried to load a dataset although the statistics are cached")

    monkeypatch.setattr(ls, "load_dataset", no_download)
    loaded = ls.layer_stats(
        model,
        tok,
        LAYERS[0],
        tmp_path / "ours",
        "tinycorpus",
        ["mom2"],
        sample_size=6,
        precision="float32",
        progress=lambda it, total=None: it,
        hparams=type("H", (), {"device": "cpu"})(),
    )
    assert torch.equal(loaded.mom2.moment(), mom2 / count)


def _write(tmp_path, texts):
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in texts))
    return str(path)
