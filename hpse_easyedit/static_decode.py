"""A decode step that can be captured as one graph (the ``static_decode`` hparams switch).

Today's decode (``rollout.py``, ``generation.py``) grows a ``DynamicCache`` token by token, lets
transformers rebuild the attention mask from a 2D padding mask each step (which checks the mask on
the host), and tests the stop tokens with ``bool(...)`` after every token: shapes change every step
and the host waits for the device twice per token. Here every tensor a step touches is allocated
once per decode:

- a transformers ``StaticCache`` sized to the longest prompt plus ``max_new_tokens``;
- the padding mask of the whole decode (prompt padding, then ones) and the key positions, from which
  each step builds its 4D mask on the device (no host check, the same shape every step);
- the write slot and the rows' position ids as device tensors that each step advances.

``StaticDecoder.step`` is then a function of fixed-shape tensors with no host synchronisation: it
compiles with ``torch.compile(fullgraph=True)`` (on CUDA ``mode="reduce-overhead"``, CUDA graphs)
and its greedy tokens are the dynamic path's (``tests/test_static_decode.py``). The drivers test for
stop tokens every ``stop_every`` tokens, the one host synchronisation of the loop, and discard the
steps decoded past the stop.

One decoder per shape, kept, for the compiled decode: ``kept_decoder`` hands out the decoder kept
for the model (its base, under a peft wrapper) whose batch, prompt width and length match, refilled
in place for the new rows (``StaticDecoder.refill``: the cache zeroed, the masks and positions
rewritten; every address the same), and builds one only for a shape it has not kept (up to
``KEPT_DECODERS`` per model, the oldest dropped). Prompt widths are rounded up to a multiple of
``WIDTH_STEP`` (extra left padding, masked), so the rounds of an edit, and the edits of a run whose
prompts fall in the same step, decode on the same tensors and replay one compiled step (one CUDA
graph) instead of recording a new one per rollout. The kept decoders' caches stay allocated between
decodes (the memory planner counts the rollout's through the training phase);
``release_decoders(model)`` frees them. An uncompiled static decode (``static_decode: true``)
captures nothing, so it keeps nothing: a new decoder of the rows' own width per decode, its cache
freed after.

Limits: the attention implementation must take a 4D mask (``sdpa`` or ``eager``; not
``flash_attention_2``), and a model with sliding-window layers must have a window at least as long
as the decode (Gemma-2's 4096 covers ``max_length`` up to 4096)."""

from __future__ import annotations

import contextlib
import functools
import logging
import weakref
from collections import OrderedDict
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.nn.functional as F

from .model_calls import cache_keyword
from .padding import pad_rows

__all__ = [
    "StaticDecoder",
    "attention_problem",
    "check_static_decode",
    "compile_step",
    "compiler_problem",
    "decode_mode",
    "kept_decoder",
    "kept_width",
    "release_decoders",
    "plain_greedy",
    "static_generate",
]

logger = logging.getLogger(__name__)

#: prompt widths of a kept decoder are rounded up to a multiple of this (``kept_decoder``)
WIDTH_STEP = 32
#: decoders kept per model, one per shape (``kept_decoder``); the least recently used goes first
KEPT_DECODERS = 4
#: how many compiled decode-step graphs one process may hold (dynamo's default is 8 per function)
DECODE_GRAPHS = 64

#: attention implementations whose layers take the 4D mask this module builds
MASK_4D_ATTENTION = ("sdpa", "eager")

#: generation-config fields that change greedy tokens in ``model.generate`` (the static path applies
#: none)
_LOGIT_PROCESSING = {
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "min_length": 0,
    "min_new_tokens": None,
    "sequence_bias": None,
    "encoder_repetition_penalty": 1.0,
}


def _text_config(model: Any) -> Any:
    config = model.config
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def attention_problem(impl: str | None) -> str | None:
    """Why the static decode cannot run on attention implementation ``impl`` (a model config's
    ``_attn_implementation``; None = eager), or None when it can."""
    impl = impl or "eager"
    if impl in MASK_4D_ATTENTION:
        return None
    return (
        "static_decode needs attention that takes a 4D mask "
        f"({', '.join(MASK_4D_ATTENTION)}), but the model runs {impl!r}; set "
        "attn_implementation to sdpa or eager, or static_decode: false"
    )


def check_static_decode(model: Any, length: int) -> str | None:
    """Why ``model`` cannot decode ``length`` tokens on the static path, or None when it can."""
    config = _text_config(model)
    problem = attention_problem(getattr(config, "_attn_implementation", None))
    if problem is not None:
        return problem
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None) or ()
    if window and "sliding_attention" in types and length > window:
        return (
            f"static_decode needs the decode ({length} tokens) within the sliding window "
            f"({window}); lower max_length, or set static_decode: false"
        )
    return None


@functools.cache
def compiler_problem(device_type: str) -> str | None:
    """Why ``torch.compile`` (inductor) cannot build kernels for ``device_type`` on this machine, or
    None: CUDA kernels need Triton, CPU kernels a C++ compiler. Checked once per process, without
    compiling anything."""
    if device_type == "cuda":
        from torch.utils._triton import has_triton

        if has_triton():
            return None
        return (
            "torch.compile builds CUDA kernels with Triton, which this machine lacks (the CUDA "
            "wheels of torch bring it: pip install triton)"
        )
    if device_type == "cpu":
        try:
            from torch._inductor.cpp_builder import get_cpp_compiler

            get_cpp_compiler()
        except Exception as err:  # noqa: BLE001 - inductor's own error for a missing compiler
            reason = " ".join(str(err).split())[:160]
            return (
                "torch.compile builds CPU kernels with a C++ compiler, and none was found "
                f"({reason}); install g++ or point CXX at one"
            )
    return None


def decode_mode(setting: bool | str, model: Any) -> bool | str:
    """The decode a ``static_decode`` setting means for ``model``: ``"auto"`` is ``"compile"`` (the
    step under CUDA graphs) on a CUDA device and the dynamic path (False) elsewhere; on a CUDA
    device whose model runs attention without a 4D mask (``flash_attention_2``) it is the dynamic
    path too, and where no compiler works (``compiler_problem``) the static path uncompiled
    (True). Any other value is itself."""
    if setting != "auto":
        return setting
    device = _model_device(model)
    if device.type != "cuda":
        return False
    if attention_problem(getattr(_text_config(model), "_attn_implementation", None)):
        _log_once(
            logging.INFO,
            "static_decode: auto decodes on the dynamic path: the model's attention takes no 4D "
            "mask",
        )
        return False
    problem = compiler_problem(device.type)
    if problem is not None:
        _log_once(
            logging.WARNING, f"static_decode: auto decodes on the static path uncompiled: {problem}"
        )
        return True
    return "compile"


@functools.cache
def _log_once(level: int, message: str) -> None:
    logger.log(level, message)


def _model_device(model: Any) -> torch.device:
    try:
        return model.get_input_embeddings().weight.device
    except (AttributeError, NotImplementedError):
        return next(model.parameters()).device


class StaticDecoder:
    """Greedy decoding of left-padded ``rows`` on a preallocated KV cache of ``len(prompt) +
    max_new_tokens``.

    ``prefill()`` runs the prompts and returns the last position's float32 log-probabilities ``[B,
    V]``; each ``step(tokens)`` (``[B, 1]``) appends one token per row and returns the next
    log-probabilities. Nothing in ``step`` reads a device value on the host."""

    def __init__(
        self,
        model: Any,
        rows: Sequence[Sequence[int]],
        pad_id: int,
        max_new_tokens: int,
        *,
        width: int | None = None,
    ) -> None:
        from transformers import StaticCache

        self._attach(model)
        device = _model_device(model)
        ids, mask = _left_padded(rows, pad_id, width)
        batch, width = ids.shape
        self.width, self.length = width, width + max_new_tokens
        reason = check_static_decode(model, self.length)
        if reason is not None:
            raise ValueError(reason)
        config = _text_config(model)
        self.cache = StaticCache(config=config, max_cache_len=self.length)
        self.ids = ids.to(device)
        self.prompt_positions = (mask.cumsum(-1) - 1).clamp(min=0).to(device)
        kv_ok = torch.ones(batch, self.length, dtype=torch.bool)
        kv_ok[:, :width] = mask.bool()
        self.kv_ok = kv_ok.to(device)[:, None, None, :]  # [B, 1, 1, L]: keys a real token wrote
        self.kv_index = torch.arange(self.length, device=device)  # [L]
        impl = getattr(config, "_attn_implementation", None) or "eager"
        dtype = next(model.parameters()).dtype
        self.additive = (
            None if impl == "sdpa" else torch.finfo(dtype).min
        )  # eager adds a float mask
        self.mask_dtype = dtype
        self.positions = self.prompt_positions[
            :, -1:
        ].clone()  # [B, 1]: the last written position per row
        self.slot = torch.full(
            (1,), width - 1, dtype=torch.long, device=device
        )  # the last written cache slot
        # fixed addresses (as StaticCache marks its keys and values): a compiled step that updates
        # slot and positions in place is then captured as a CUDA graph, not skipped for mutating
        # its inputs
        for state in (self.slot, self.positions, self.kv_ok, self.kv_index):
            torch._dynamo.mark_static_address(state)

    def _attach(self, model: Any) -> None:
        self.model = model
        # ``cache`` on transformers >= 5.24, ``past_key_values`` before: a keyword the forward does
        # not take lands in its **kwargs unread, and the model then decodes on a DynamicCache of
        # its own that the mask below (sized to this StaticCache) does not fit
        self.cache_keyword = cache_keyword(model)

    def refill(self, model: Any, rows: Sequence[Sequence[int]], pad_id: int) -> None:
        """Decode ``rows`` next (as many as this decoder has, none longer than its prompt width),
        on this decoder's tensors: the cache zeroed and the prompts, masks and positions rewritten
        in place, so every tensor keeps its address (a compiled step replays, a CUDA graph is not
        recorded again). The tokens are a new decoder's for the same rows and width."""
        ids, mask = _left_padded(rows, pad_id, self.width)
        if ids.shape != self.ids.shape:
            raise ValueError(
                f"rows of shape {tuple(ids.shape)} do not fit a decoder of {tuple(self.ids.shape)}"
            )
        self._attach(model)
        device = self.ids.device
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        self.ids.copy_(ids.to(device))
        self.prompt_positions.copy_(positions.to(device))
        self.kv_ok[:, 0, 0, : self.width].copy_(mask.bool().to(device))
        self.positions.copy_(self.prompt_positions[:, -1:])
        self.slot.fill_(self.width - 1)
        self.cache.reset()

    def compiled_step(
        self,
        compile: Callable[..., Callable[[torch.Tensor], torch.Tensor]] | None = None,
        backend: str | None = None,
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """``compile(self)`` (default ``compile_step``; ``compile(self, backend)`` with a backend),
        made once per decoder, compiler and backend and kept: a refilled decoder replays it."""
        compile = compile or compile_step
        kept = self.__dict__.setdefault("_compiled", {})
        key = (compile, backend)
        if key not in kept:
            kept[key] = compile(self) if backend is None else compile(self, backend)
        return kept[key]

    def _mask(self, query_slots: torch.Tensor) -> torch.Tensor:
        """The 4D mask ``[B, 1, Q, L]`` of queries at cache slots ``query_slots`` ``[Q]``: causal,
        padding keys masked, each query always seeing its own slot (so a padding query's row is
        never empty)."""
        keys = self.kv_index.view(1, 1, 1, -1)
        queries = query_slots.view(1, 1, -1, 1)
        allowed = (self.kv_ok & (keys <= queries)) | (keys == queries)
        if self.additive is None:
            return allowed
        zero = torch.zeros((), dtype=self.mask_dtype, device=allowed.device)
        return torch.where(allowed, zero, torch.full_like(zero, self.additive))

    def _forward(
        self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_keyword: self.cache},
        )
        return F.log_softmax(out.logits[:, -1, :].float(), dim=-1)

    def prefill(self) -> torch.Tensor:
        """The prompts through the model (filling cache slots ``0..width-1``); next-token log-probs
        ``[B, V]``."""
        return self._forward(
            self.ids, self.prompt_positions, self._mask(self.kv_index[: self.width])
        )

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append ``tokens`` ``[B, 1]`` at the next slot; next-token log-probs ``[B, V]``. No host
        sync."""
        self.slot.add_(1)
        self.positions.add_(1)
        return self._forward(tokens, self.positions, self._mask(self.slot))


def compile_step(
    decoder: StaticDecoder, backend: str | None = None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``decoder.step`` under ``torch.compile(fullgraph=True)``: CUDA graphs (``reduce-overhead``)
    on CUDA, inductor elsewhere; ``backend`` overrides the compiler (the tests trace with
    ``"eager"``)."""
    if backend is not None:
        compiled = torch.compile(decoder.step, fullgraph=True, backend=backend)
    else:
        cuda = decoder.kv_index.device.type == "cuda"
        compiled = torch.compile(
            decoder.step, fullgraph=True, mode="reduce-overhead" if cuda else None
        )

    def step(tokens: torch.Tensor) -> torch.Tensor:
        # every decoder's ``step`` is one code object to dynamo, which keeps at most
        # ``recompile_limit`` (8) graphs per code object and, under ``fullgraph``, fails past it: a
        # process that decodes several models or many kept shapes (tests, a study) needs more
        with torch._dynamo.config.patch(recompile_limit=DECODE_GRAPHS):
            return compiled(tokens)

    return step


def _left_padded(
    rows: Sequence[Sequence[int]], pad_id: int, width: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``pad_rows(rows, left=True)``, padded further on the left to ``width`` when given."""
    ids, mask = pad_rows(rows, pad_id, left=True)
    extra = 0 if width is None else width - ids.shape[1]
    if extra < 0:
        raise ValueError(f"a row of {ids.shape[1]} tokens is longer than the width {width}")
    if extra:
        ids = torch.cat([ids.new_full((ids.shape[0], extra), pad_id), ids], dim=1)
        mask = torch.cat([mask.new_zeros((mask.shape[0], extra)), mask], dim=1)
    return ids, mask


def kept_width(rows: Sequence[Sequence[int]]) -> int:
    """The prompt width of the kept decoder of ``rows``: the longest row, rounded up to a multiple
    of ``WIDTH_STEP``."""
    return -(-max(len(r) for r in rows) // WIDTH_STEP) * WIDTH_STEP


#: per model (its base, under a peft wrapper): the kept decoders by shape, least recently used first
_KEPT: "weakref.WeakKeyDictionary[Any, OrderedDict]" = weakref.WeakKeyDictionary()


def _base(model: Any) -> Any:
    from .executors.state import unwrapped

    return unwrapped(model)


@contextlib.contextmanager
def kept_decoder(
    model: Any,
    rows: Sequence[Sequence[int]],
    pad_id: int,
    max_new_tokens: int,
    keep: bool = True,
) -> Iterator[StaticDecoder]:
    """A ``StaticDecoder`` for ``rows``, their prompt width rounded up to a multiple of
    ``WIDTH_STEP``: the one kept for ``model`` with this batch, width, length, device and dtype,
    refilled in place, or a new one kept for the next decode of that shape (see the module
    docstring). Inside the block the decoder runs ``model``; it holds no reference to it after.
    ``keep=False`` (a decode that is not compiled, where no capture is to be reused): a new decoder
    of the rows' own width, dropped after, as before decoders were kept."""
    if not keep:
        yield StaticDecoder(model, rows, pad_id, max_new_tokens)
        return
    width = kept_width(rows)
    dtype = next(model.parameters()).dtype
    key = (len(rows), width, max_new_tokens, str(_model_device(model)), dtype)
    kept = _KEPT.setdefault(_base(model), OrderedDict())
    decoder = kept.pop(key, None)
    if decoder is None:
        decoder = StaticDecoder(model, rows, pad_id, max_new_tokens, width=width)
        while len(kept) >= KEPT_DECODERS:
            kept.popitem(last=False)
    else:
        decoder.refill(model, rows, pad_id)
    kept[key] = decoder
    try:
        yield decoder
    finally:
        decoder.model = None  # the kept decoder must not keep the model (the key) alive


def release_decoders(model: Any) -> None:
    """Free the decoders kept for ``model`` (their KV caches) and its decode workspace (the row
    masks and adapter copies a decode step reads); the next decode builds them again."""
    from .executors.state import release_workspace

    _KEPT.pop(_base(model), None)
    release_workspace(model)


def plain_greedy(model: Any) -> str | None:
    """The generation-config field that makes ``model.generate``'s greedy tokens differ from a plain
    argmax (e.g. a repetition penalty), or None: the static path applies no logits processor."""
    config = getattr(model, "generation_config", None)
    for name, neutral in _LOGIT_PROCESSING.items():
        value = getattr(config, name, neutral)
        if value is not None and value != neutral:
            return name
    return None


@torch.no_grad()
def static_generate(
    model: Any,
    rows: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    stop_ids: Sequence[int],
    pad_id: int,
    stop_every: int = 8,
    compile_backend: str | None = None,
    compiled: bool = False,
) -> torch.Tensor:
    """Greedy continuation of each row as ``model.generate(do_sample=False)`` gives it: ``[B, T]``
    new tokens, a row that has stopped continues with ``pad_id``, and ``T`` ends at the step where
    the last row stopped (or at ``max_new_tokens``). The stop test runs every ``stop_every``
    tokens."""
    compiled = bool(compiled or compile_backend)
    with kept_decoder(model, rows, pad_id, max_new_tokens, keep=compiled) as decoder:
        step = decoder.compiled_step(backend=compile_backend) if compiled else decoder.step
        return _greedy(decoder, step, max_new_tokens, stop_ids, pad_id, stop_every)


def _greedy(
    decoder: StaticDecoder,
    step: Callable[[torch.Tensor], torch.Tensor],
    max_new_tokens: int,
    stop_ids: Sequence[int],
    pad_id: int,
    stop_every: int,
) -> torch.Tensor:
    device = decoder.kv_index.device
    batch = decoder.ids.shape[0]
    stops = torch.tensor(sorted(set(int(i) for i in stop_ids)) or [-1], device=device)
    out = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long, device=device)
    alive_after = torch.ones(max_new_tokens, dtype=torch.bool, device=device)
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    pad = torch.full((batch,), pad_id, dtype=torch.long, device=device)
    logp = decoder.prefill()
    for n in range(max_new_tokens):
        token = torch.where(alive, logp.argmax(-1), pad)
        out[:, n] = token
        alive = alive & ~torch.isin(token, stops)
        alive_after[n] = alive.any()
        last = n + 1 == max_new_tokens
        if (n + 1) % stop_every == 0 or last:
            done = (
                ~alive_after[: n + 1]
            ).nonzero()  # the loop's one host sync, every stop_every tokens
            if done.numel():
                return out[:, : int(done[0, 0]) + 1]
        if not last:
            logp = step(token.view(batch, 1))
    return out
