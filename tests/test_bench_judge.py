"""The judge: prompts, parsing, the OpenAI-protocol client against a local server, and the lexical
fallback."""

import logging
import re

import pytest

from bench_helpers import JUDGE_ENV, ChatServer, judge_like_responder
from benchmarks.tasks.judge import (
    FIXED_DEMOS,
    ChatClient,
    CoverageItem,
    JudgeError,
    JudgeSettings,
    LexicalJudge,
    LLMJudge,
    build_coverage_prompt,
    build_decomposition_prompt,
    build_support_prompt,
    make_judge,
    parse_coverage,
    parse_decomposition,
    parse_support,
)

SECRET = "sk-test-SECRET-0123456789"


@pytest.fixture(autouse=True)
def _no_judge_env(monkeypatch):
    for var in JUDGE_ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def _client(server, tmp_path, **kw):
    settings = JudgeSettings(
        base_url=server.url,
        model="judge-model",
        api_key=SECRET,
        cache_path=str(tmp_path / "cache.sqlite"),
        **kw,
    )
    return ChatClient(settings)


def _client_waits(caplog):
    """The seconds the openai client waited before each of its own retries, from its log."""
    return [
        float(m.group(1))
        for r in caplog.records
        if r.name == "openai._base_client"
        for m in [re.match(r"Retrying request in ([\d.]+) seconds", r.getMessage())]
        if m
    ]


def _support_parse(text):
    return parse_support(text, 2)


@pytest.mark.slow
def test_client_survives_timeout_500_and_malformed_then_caches(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.INFO, logger="openai._base_client")
    good = "ITEM 1: <answer>1</answer>\nITEM 2: <answer>0</answer>"
    with ChatServer(lambda p: good) as server:
        server.script = [("sleep", 3.0), ("status", 500), ("text", "I think both are true.")]
        client = _client(server, tmp_path, timeout=0.5)
        out = client.complete("PROMPT", _support_parse)
        assert out.complete and out.value == [1, 0]
        assert len(server.prompts) == 4  # timeout, 500, malformed, success
        assert client.stats == {"requests": 4, "cache_hits": 0, "retries": 3, "malformed": 1}
        waits = _client_waits(
            caplog
        )  # the openai client's own exponential backoff before its 2 retries;
        assert (
            len(waits) == 2 and 0 < waits[0] < waits[1]
        )  # the malformed answer is asked again at once
        assert all(h == f"Bearer {SECRET}" for h in server.auth_headers)

        again = client.complete("PROMPT", _support_parse)  # same model + prompt: from the cache
        assert again.value == [1, 0] and len(server.prompts) == 4
        client.close()
        rerun = _client(server, tmp_path)  # a new process reading the same on-disk cache
        assert rerun.complete("PROMPT", _support_parse).value == [1, 0]
        assert len(server.prompts) == 4 and rerun.stats["cache_hits"] == 1
        other_model = ChatClient(
            JudgeSettings(
                base_url=server.url, model="another", cache_path=str(tmp_path / "cache.sqlite")
            )
        )
        other_model.complete("PROMPT", _support_parse)
        assert len(server.prompts) == 5  # the cache is keyed by model too
    assert SECRET not in caplog.text


@pytest.mark.slow
def test_a_judge_that_drips_one_byte_at_a_time_is_bounded_by_the_timeout(tmp_path):
    """Each byte arrives well within the read timeout, so only a deadline on the whole request
    ends it: two requests of at most 1 s each (and the openai client's backoff between them), where
    the answer would take over 20 s to arrive."""
    import time

    with ChatServer(lambda p: "ITEM 1: <answer>1</answer>\nITEM 2: <answer>0</answer>") as server:
        server.script = [("drip", 0.05)] * 2
        client = _client(server, tmp_path, timeout=1.0, max_attempts=2)
        start = time.monotonic()
        with pytest.raises(JudgeError, match="failed 2 times, last error: APITimeoutError"):
            client.complete("P", _support_parse)
        assert time.monotonic() - start < 6
        assert len(server.prompts) == 2
        assert client.complete("Q", _support_parse).value == [1, 0]  # a prompt answer still lands


def test_an_unwritable_judge_cache_names_the_fix(tmp_path):
    with ChatServer() as server, pytest.raises(JudgeError, match="HPSE_CACHE_DIR"):
        ChatClient(JudgeSettings(base_url=server.url, cache_path="/sys/hpse-judge/cache.sqlite"))


@pytest.mark.slow
def test_client_gives_up_after_max_attempts(tmp_path):
    with ChatServer(lambda p: "no verdicts here") as server:
        client = _client(server, tmp_path, max_attempts=3)
        out = client.complete("P", _support_parse)
        assert not out.complete and out.value == [None, None]
        assert len(server.prompts) == 3
        client.complete("P", _support_parse)
        assert len(server.prompts) == 6  # malformed answers are never cached
        server.script = [("status", 503)] * 3
        with pytest.raises(JudgeError, match="failed 3 times"):
            client.complete("Q", _support_parse)


@pytest.mark.slow
def test_max_attempts_bounds_the_requests_of_one_question_retries_and_reasks_together(tmp_path):
    with ChatServer(lambda p: "no verdicts here") as server:
        server.script = [
            ("text", "still no verdicts"),
            ("status", 503),
            ("status", 503),
            ("status", 503),
        ]
        client = _client(server, tmp_path, max_attempts=3)
        out = client.complete(
            "P", _support_parse
        )  # malformed, re-asked: the openai client retries the 503 once
        assert not out.complete and len(server.prompts) == 3
        assert client.stats == {"requests": 3, "cache_hits": 0, "retries": 2, "malformed": 1}


def test_client_does_not_retry_auth_errors_and_never_shows_the_key(tmp_path, caplog):
    with ChatServer() as server:
        server.script = [("status", 401)]
        client = _client(server, tmp_path)
        with pytest.raises(JudgeError, match="HTTP 401") as err:
            client.complete("P", _support_parse)
        assert len(server.prompts) == 1
        assert SECRET not in str(err.value) and SECRET not in caplog.text
        assert SECRET not in repr(client.settings)


def test_settings_come_from_options_then_environment(monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "env-key")
    monkeypatch.setenv("HPSE_JUDGE_MODEL", "env-model")
    resolved = JudgeSettings().resolve()
    assert (resolved.base_url, resolved.model, resolved.api_key) == (
        "http://127.0.0.1:9/v1",
        "env-model",
        "env-key",
    )
    monkeypatch.setenv("HPSE_JUDGE_API_KEY", "hpse-key")
    assert JudgeSettings().resolve().api_key == "hpse-key"
    explicit = JudgeSettings(base_url="http://x/v1", model="m", api_key="k").resolve()
    assert (explicit.base_url, explicit.model, explicit.api_key) == ("http://x/v1", "m", "k")
    monkeypatch.delenv("HPSE_JUDGE_MODEL")
    assert JudgeSettings().resolve().model == "gemini-2.5-flash"
    assert isinstance(make_judge("auto", JudgeSettings()), LLMJudge)  # an endpoint is configured


def test_no_endpoint_is_a_clear_error_and_auto_falls_back_to_lexical(caplog):
    with pytest.raises(JudgeError, match="--judge-base-url"):
        ChatClient(JudgeSettings())
    judge = make_judge("auto", JudgeSettings())
    assert isinstance(judge, LexicalJudge) and judge.name == "lexical-fallback"
    assert "LEXICAL FALLBACK" in caplog.text


def test_llm_judge_sends_the_paper_prompts_and_scores_factscore_and_dmp(tmp_path):
    with ChatServer(judge_like_responder) as server:
        judge = LLMJudge(_client(server, tmp_path))
        answer = (
            "George Rankin is a politician. He served two terms on the city council. He likes tea."
        )
        fs = judge.factscore(answer, "PASSAGE TEXT", "George Rankin")
        # the responder makes each sentence one fact and marks odd items supported: facts 1 and 3 of
        # 3
        assert fs.facts == [
            "George Rankin is a politician.",
            "He served two terms on the city council.",
            "He likes tea.",
        ]
        assert (
            fs.supported == [True, False, True] and fs.score == pytest.approx(2 / 3) and fs.complete
        )
        decomposition, support = server.prompts
        assert (
            decomposition.count("Please breakdown the following sentence into independent facts: ")
            == FIXED_DEMOS + 1
        )
        assert "Sentence 3: He likes tea.\n" in decomposition
        assert support.startswith(
            "Answer the questions about George Rankin "
            "based on the given context.\n\nPASSAGE TEXT\n\n"
        )
        assert "ITEM 2: Input: He served two terms on the city council. True or False?" in support
        scores, complete = judge.coverage(
            [CoverageItem("Q1?", "E1", "A1"), CoverageItem("Q2?", "E2", "A2")]
        )
        assert scores == [1, 1] and complete
        assert server.prompts[-1].startswith("You are scoring atomic sub-questions.")
        n = len(server.prompts)
        judge.factscore(answer, "PASSAGE TEXT", "George Rankin")
        assert len(server.prompts) == n  # rerun costs nothing
        assert judge.factscore("", "PASSAGE", "X").score == 0.0 and len(server.prompts) == n


def test_prompts_are_the_papers_wording():
    d = build_decomposition_prompt(["The river rises in the Alps."])
    assert (
        "Now break down EACH of the following sentences into independent facts. For each "
        "sentence, output its header then one '- fact' line "
        "per fact:\n\nSentence 1: The river rises in the Alps.\n"
    ) in d
    # the BM25-retrieved demonstration is the river one, shown after the 7 fixed ones
    assert d.rfind("The river rises in the Alps, flows north") > d.rfind(
        "He is a retired goalkeeper"
    )
    s = build_support_prompt("s", "c", ["f1"])
    assert s.endswith(
        "Think briefly about each item, then output ONE line per item, in order, EXACTLY like:\n"
        "ITEM 1: <answer>1</answer>\n(1 = True/supported by the context, 0 = False/not supported)"
    )
    c = build_coverage_prompt([CoverageItem("When?", "In 1991.", "1991")])
    assert "ITEM 1:\n  Sub-question: When?\n  Expected fact: In 1991.\n  Model answer: 1991\n" in c
    assert "never penalize the answer for disagreeing with reality" in c
    assert "ITEM 1: <score>SCORE</score> <explanation>EXPLANATION</explanation>" in c


def test_parsers_are_robust_to_formatting_and_report_missing_items():
    text = (
        "Sentence 1: A is B.\n- A is B.\n* A is a thing.\nSentence 2: C.\n  - A is B.\n1. C exists."
    )
    out = parse_decomposition(text, 2)
    assert out.value == ["A is B.", "A is a thing.", "C exists."] and out.complete
    assert not parse_decomposition(
        "Sentence 1: x\n- x", 2
    ).complete  # sentence 2 missing (truncated)
    assert not parse_decomposition("I cannot do that.", 1).complete
    reasoning = (
        "ITEM 1: the context says so, <answer>0</answer>? no wait.\n"
        "Final:\nITEM 1: <answer>1</answer>\nITEM 2: <answer> False </answer>"
    )
    assert parse_support(reasoning, 2).value == [1, 0]  # the last verdict per item wins
    partial = parse_support("ITEM 1: <answer>1</answer>", 3)
    assert partial.value == [1, None, None] and not partial.complete
    assert parse_support("ITEM 1: <answer>maybe</answer>", 1).value == [None]
    cov = parse_coverage(
        "**ITEM 1:** <score>1</score> <explanation>ok</explanation>\nITEM 2: <score>0</score>", 2
    )
    assert cov.value == [1, 0] and cov.complete


def test_lexical_fallback_judge_hand_cases():
    judge = LexicalJudge()
    passage = (
        "George Rankin served two terms as a city council "
        "member and was elected state representative."
    )
    fs = judge.factscore(
        "George Rankin served on the city council. He plays golf every weekend.", passage, "G"
    )
    # sentence 1 content words: george rankin served city council -> 5/5 in the passage; sentence 2:
    # 0/4
    assert fs.supported == [True, False] and fs.score == 0.5
    scores, complete = judge.coverage(
        [
            CoverageItem(
                "How long has he been in politics?", "Over a decade.", "For over a decade now."
            ),
            CoverageItem(
                "What positions has he held?",
                "City council member and state representative.",
                "A mayor.",
            ),
        ]
    )
    assert scores == [1, 0] and complete
