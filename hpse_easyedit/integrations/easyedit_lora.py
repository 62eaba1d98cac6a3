"""EasyEdit's own LoRA editor (``easyeditor.models.lora``), called directly: the one place outside
the plugin's entry points that runs an EasyEdit algorithm, for the perf report, which times it
beside HPSE's edit on the same model and passage (``benchmarks.perf.measure``)."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

__all__ = ["easyedit_lora_editor"]


def easyedit_lora_editor() -> Callable[[Any, Any, Sequence[Mapping], Mapping[str, Any]], Any]:
    """``edit(model, tokenizer, requests, config)``: EasyEdit's ``apply_lora_to_model`` with
    ``LoRAHyperParams(**config)``. Raises whatever importing EasyEdit raises where it is absent or
    broken (``$EASYEDIT_SRC``, docs/EASYEDIT.md)."""
    # EasyEdit is importable only once hpse_easyedit.easyedit has put it on the path
    # isort: off
    import hpse_easyedit.easyedit  # noqa: F401  (imports EasyEdit from $EASYEDIT_SRC)
    from easyeditor.models.lora.lora_hparams import LoRAHyperParams
    from easyeditor.models.lora.lora_main import apply_lora_to_model

    # isort: on

    def edit(model: Any, tok: Any, requests: Sequence[Mapping], config: Mapping[str, Any]) -> Any:
        return apply_lora_to_model(model, tok, list(requests), LoRAHyperParams(**config))

    return edit
