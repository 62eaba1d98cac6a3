from setuptools import find_packages, setup

setup(
    name="hpse-easyedit",
    version="0.1.0",
    description="Hybrid-Policy Self-Editing (HPSE) for unstructured "
    "knowledge editing, as an EasyEdit plugin",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(
        include=["hpse_easyedit", "hpse_easyedit.*", "benchmarks", "benchmarks.*"]
    ),
    package_data={
        "hpse_easyedit": ["demo_passage.txt", "backbones/*.json"],
        "benchmarks": ["report/templates/*", "perf/easyedit_lora.yaml"],
    },
    install_requires=[
        "torch>=2.1",
        # CI runs the newest (make test) and the [easyedit] extra's < 5.24 (make test-easyedit-env:
        # the decode, 7B-9B rehearsal, CUDA and EasyEdit tests); the KV cache's forward keyword is
        # ``cache`` from 5.24, ``past_key_values`` before (hpse_easyedit.model_calls.cache_keyword)
        "transformers>=4.45",
        "peft>=0.12",
        "pyyaml>=6",
        "accelerate>=0.30",
        "gguf>=0.10",
        "datasets>=2.18",
        "openai>=1.30",
        "tqdm>=4.60",
        "matplotlib>=3.7",
        "packaging>=20",  # version comparisons (hpse_easyedit.loading)
        # np.random.default_rng: the bootstrap intervals (benchmarks.analysis.paired.bootstrap_ci)
        "numpy>=1.22",
        "nltk>=3.8",  # SelfBLEU-4 (benchmarks.tasks.metrics.bleu): the sentence_bleu Texygen calls
        # names the encoding of a passage file that is not UTF-8 (hpse_easyedit.encoding)
        "charset-normalizer>=3",
        # UnKE's own ROUGE recall (benchmarks.tasks.unke_scores), the package EasyEdit calls
        "rouge>=1.0.1",
        "jinja2>=3.0",  # the HTML report's templates (benchmarks/report/templates)
        "pydantic>=2",  # the hparams schemas (hpse_easyedit.hparams)
    ],
    extras_require={
        "test": ["pytest>=7", "pytest-timeout>=2", "pytest-xdist>=3.5"],
        # `make lint` (ruff.toml); pinned: a newer ruff may add checks to the selected rule sets
        "lint": ["ruff==0.17.6"],
        # pure-Python packages EasyEdit's import chain needs for text editing (see
        # docs/EASYEDIT.md), and a transformers that still has the modules it imports (5.24 removed
        # one that EasyEdit's UnKE imports; hpse_easyedit.integrations.easyedit_import.EASYEDIT_PINS
        # holds the same pin); sentence-transformers for the MiniLM score of eval_akew_unstructured,
        # which EasyEdit's unstructured example imports
        "easyedit": [
            "higher==0.2.1",
            "einops",
            "hydra-core",
            "nltk",
            "rouge",
            "sentence-transformers",
            "transformers<5.24",
        ],
        # TRL's on-policy self-distillation trainer (trl.experimental.sdft), which the SDFT (TRL)
        # row runs (hpse_easyedit.integrations.sdft); pinned: an experimental API of one release
        "trl": ["trl==1.16.*"],
        # llama.cpp's OpenAI-compatible server, to run the judge locally (compiles llama.cpp: long
        # on a small CPU)
        "judge-server": ["llama-cpp-python[server]>=0.3"],
    },
    entry_points={"console_scripts": ["hpse-edit=hpse_easyedit.cli:main"]},
)
