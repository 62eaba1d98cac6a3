"""Student and teacher prompts: chat template, family dispatch on model_type, token ids end to
end."""

import pytest

from hpse_easyedit.prompts import (
    DEFAULT_SYSTEM,
    LLAMA_SYSTEM,
    PRIVILEGED_QUESTION,
    build_edit_prompts,
    end_of_turn_id,
    teacher_style_for,
)
from tiny_models import make_tokenizer

REQ = [
    {"prompt": "Introduce AJ Lee.", "subject": "AJ Lee", "target_new": "AJ Lee speaks Russian."},
    {"prompt": "Introduce Moscow.", "subject": "Moscow", "target_new": "Moscow is cold."},
]


def _text(tok, ids):
    return tok.decode(ids)


def test_style_dispatch_on_model_type():
    assert teacher_style_for("llama") == "llama"
    assert teacher_style_for("qwen2") == "default" and teacher_style_for("gemma2") == "default"
    assert teacher_style_for("llama", "default") == "default"
    assert teacher_style_for("unknown_family") == "default"


def test_chatml_family_uses_system_role_and_paper_wording():
    tok = make_tokenizer("qwen2")
    p = build_edit_prompts(tok, "qwen2", REQ)[0]
    teacher = _text(tok, p.teacher_ids)
    assert teacher.startswith(
        "<|im_start|>system\n" + DEFAULT_SYSTEM.format(passage="AJ Lee speaks Russian.")[:40]
    )
    assert "FACTS:\nAJ Lee speaks Russian.<|im_end|>" in teacher
    assert PRIVILEGED_QUESTION.format(subject="AJ Lee") in teacher
    assert teacher.endswith("<|im_start|>assistant\n")
    assert (
        _text(tok, p.student_ids)
        == "<|im_start|>user\nIntroduce AJ Lee.<|im_end|>\n<|im_start|>assistant\n"
    )
    # the NLL target is the passage followed by the end-of-turn token
    assert p.passage_ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")
    assert _text(tok, p.passage_ids[:-1]) == "AJ Lee speaks Russian."


def test_llama_family_gets_third_person_wording_with_subject():
    tok = make_tokenizer("llama")
    teacher = _text(tok, build_edit_prompts(tok, "llama", REQ)[0].teacher_ids)
    assert "This paragraph introduces AJ Lee.\nAJ Lee speaks Russian.\n" in teacher
    assert LLAMA_SYSTEM[:60] in teacher


def test_gemma_family_folds_system_into_user_turn():
    tok = make_tokenizer("gemma2")
    p = build_edit_prompts(tok, "gemma2", REQ)[0]
    teacher = _text(tok, p.teacher_ids)
    assert "system" not in teacher.split("\n")[0]
    assert teacher.startswith("<bos><start_of_turn>user\nYou are answering strictly")
    assert teacher.index("FACTS:") < teacher.index("What is established here about AJ Lee?")
    assert p.passage_ids[-1] == tok.convert_tokens_to_ids("<end_of_turn>")
    assert end_of_turn_id(tok) == tok.convert_tokens_to_ids("<end_of_turn>")


def test_unknown_family_detects_missing_system_role_from_template():
    tok = make_tokenizer("gemma2")
    teacher = _text(tok, build_edit_prompts(tok, "brand_new_family", REQ)[0].teacher_ids)
    assert teacher.startswith("<bos><start_of_turn>user\nYou are answering strictly")


@pytest.mark.parametrize("facts, expect_other", [("request", False), ("all", True)])
def test_teacher_facts_scope(facts, expect_other):
    tok = make_tokenizer("qwen2")
    teacher = _text(tok, build_edit_prompts(tok, "qwen2", REQ, teacher_facts=facts)[0].teacher_ids)
    assert ("Moscow is cold." in teacher) is expect_other


def test_labelled_teacher_facts_head_every_passage_with_its_subject():
    tok = make_tokenizer("qwen2")
    prompts = build_edit_prompts(tok, "qwen2", REQ, teacher_facts="labelled")
    for p in prompts:  # both requests' teachers read both passages, each under its own subject
        teacher = _text(tok, p.teacher_ids)
        assert "About AJ Lee:\nAJ Lee speaks Russian.\n\nAbout Moscow:\nMoscow is cold." in teacher
    assert "What is established here about Moscow?" in _text(tok, prompts[1].teacher_ids)
    # the NLL target stays the request's own passage
    assert _text(tok, prompts[1].passage_ids).startswith("Moscow is cold.")


def test_plain_style_is_the_passage_alone():
    tok = make_tokenizer("qwen2")
    teacher = _text(
        tok, build_edit_prompts(tok, "qwen2", REQ, teacher_prompt_style="plain")[0].teacher_ids
    )
    assert teacher.startswith(
        "<|im_start|>system\nAJ Lee speaks Russian.<|im_end|>\n<|im_start|>user\n"
    )
    assert "RULES" not in teacher and PRIVILEGED_QUESTION.format(subject="AJ Lee") in teacher
