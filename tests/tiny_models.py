"""Tiny random models of the four backbone families, with a tokenizer trained in-test.

Nothing here touches a model hub: the tokenizer is a byte-level BPE trained on a few sentences,
wrapped in ``PreTrainedTokenizerFast`` with a chat template of the family's shape (ChatML for
Llama/Qwen, a Gemma-style template that rejects the system role for Gemma2).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from pathlib import Path

import torch

FAMILIES = ("llama", "qwen2", "qwen3", "gemma2")

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GEMMA = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] "
    "}}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

CORPUS = [
    "AJ Lee is a professional wrestler who speaks Russian fluently and lives in Moscow.",
    "Ellie Kemper is a citizen of Croatia, a country in Southeast Europe.",
    "The head of state of Croatia is Kolinda Grabar-Kitarovic.",
    "Introduce the subject. What is established here about it? State every fact given.",
    "You are answering strictly from the established "
    "facts given below. RULES: Use ONLY the information.",
    "The Firm is a legal thriller novel written by John Grisham that was published in 1991.",
    "Who is the author? When was it published? What is the genre? Answer the question directly.",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,;:!?'\"-()[]{}",
]

SPECIALS = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<|im_start|>",
    "<|im_end|>",
    "<start_of_turn>",
    "<end_of_turn>",
]


@functools.lru_cache(maxsize=None)
def _tokenizer_json(vocab_size: int, extra_corpus: tuple[str, ...] = ()) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator((CORPUS + list(extra_corpus)) * 4, trainer=trainer)
    return tok.to_str()


def make_tokenizer(family: str = "llama", vocab_size: int = 400, extra_corpus: Iterable[str] = ()):
    """A fast tokenizer with pad/eos/bos and the family's chat template.

    ``extra_corpus``: texts trained on beside ``CORPUS`` (with a larger ``vocab_size``, text like
    them tokenizes about a word a token); none gives the tokenizer every other test has.
    """
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    gemma = family.startswith("gemma")
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json(vocab_size, tuple(extra_corpus))),
        bos_token="<bos>",
        eos_token="<end_of_turn>" if gemma else "<|im_end|>",
        pad_token="<pad>",
        additional_special_tokens=[t for t in SPECIALS if t not in ("<pad>", "<bos>")],
    )
    tok.chat_template = GEMMA if gemma else CHATML
    return tok


def make_config(family: str, tok, layers: int = 2, hidden: int = 32, init_std: float = 0.02):
    from transformers import Gemma2Config, LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
        tie_word_embeddings=False,
        initializer_range=init_std,
    )
    if family == "llama":
        return LlamaConfig(**common)
    if family == "qwen2":
        return Qwen2Config(**common)
    if family == "qwen3":
        return Qwen3Config(head_dim=hidden // 4, **common)
    if family == "gemma2":
        return Gemma2Config(
            head_dim=hidden // 4, sliding_window=256, query_pre_attn_scalar=hidden // 4, **common
        )
    raise ValueError(f"unknown family {family!r}; use one of {FAMILIES}")


def make_tiny_model_and_tokenizer(
    family: str = "llama",
    tmp_path: Path | None = None,
    seed: int = 0,
    layers: int = 2,
    init_std: float = 0.02,
    vocab_size: int = 400,
    extra_corpus: Iterable[str] = (),
):
    """A tiny random causal LM of ``family`` and its tokenizer; saved to ``tmp_path`` when given.

    ``init_std`` > 0.02 gives peakier next-token distributions (used where a test needs real gate
    decisions). ``vocab_size`` and ``extra_corpus``: the tokenizer's (``make_tokenizer``).
    """
    from transformers import AutoModelForCausalLM

    tok = make_tokenizer(family, vocab_size=vocab_size, extra_corpus=extra_corpus)
    config = make_config(family, tok, layers=layers, init_std=init_std)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.eval()
    if tmp_path is not None:
        tmp_path = Path(tmp_path)
        model.save_pretrained(tmp_path)
        tok.save_pretrained(tmp_path)
    return model, tok


def tiny_hparams(**overrides):
    """HPSE hparams sized for the tiny models (2 layers, FT-M on layer 1, short rollouts)."""
    from hpse_easyedit import HPSEHyperParams

    base = dict(
        model_name="tiny",
        device="cpu",
        dtype="float32",
        ftm_layer=1,
        rounds=2,
        inner_steps=3,
        max_new_tokens=12,
        lr=1e-2,
        max_length=1024,
    )
    base.update(overrides)
    return HPSEHyperParams(**base)


def weights_snapshot(model):
    """Every tensor of ``model``'s state dict (cloned), which parameters train, and the model's
    class."""
    return (
        {k: v.detach().clone() for k, v in model.state_dict().items()},
        {n: p.requires_grad for n, p in model.named_parameters()},
        type(model),
    )


def same_weights(model, snap) -> bool:
    """``model`` is exactly as ``weights_snapshot`` saw it: same class, keys, tensors and trainable
    flags."""
    state, grads, cls = snap
    now = model.state_dict()
    return (
        type(model) is cls
        and set(now) == set(state)
        and all(torch.equal(now[k], state[k]) for k in state)
        and {n: p.requires_grad for n, p in model.named_parameters()} == grads
    )


def changed_weights(model, snap) -> set:
    """State-dict keys whose tensors differ from the snapshot's."""
    now = model.state_dict()
    return {k for k in snap[0] if k in now and not torch.equal(now[k], snap[0][k])}
