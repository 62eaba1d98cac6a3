"""The UnKEBench judge: an LLM behind any OpenAI-compatible endpoint, or an offline lexical fallback.

``ChatClient`` sends one-message chats through the ``openai`` package, retries timeouts, connection
errors, 429 and 5xx answers with exponential backoff, re-asks when an answer cannot be parsed, and
keeps every well-formed answer in an on-disk SQLite cache keyed by the model and the exact request,
so a rerun of the same evaluation sends nothing.

``LLMJudge`` asks the paper's judge prompts (Fig. ``judge_prompt``) verbatim:
FActScore atomic-fact decomposition of each answer sentence (7 fixed + 1 BM25-retrieved
demonstrations), FActScore support validation of each fact against the edit passage, and the
decomposed-recall coverage judge for the Dmp sub-questions.

``LexicalJudge`` needs no endpoint: atomic facts are the answer's sentences, a fact counts as supported
when most of its content words occur in the passage, and a sub-question counts as answered when most
of the expected answer's content words occur in the model answer. It is a rough stand-in, so it is
named ``lexical-fallback`` in every record and summary it produced.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generic, Sequence, TypeVar

from .metrics import split_sentences, supported_fraction

__all__ = [
    "ChatClient",
    "CoverageItem",
    "FactScoreResult",
    "Judge",
    "JudgeError",
    "JudgeRefusedError",
    "JudgeSettings",
    "LEXICAL_JUDGE_NAME",
    "LLMJudge",
    "LexicalJudge",
    "Parsed",
    "ResponseCache",
    "build_coverage_prompt",
    "build_decomposition_prompt",
    "build_support_prompt",
    "make_judge",
    "parse_coverage",
    "parse_decomposition",
    "parse_support",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

LEXICAL_JUDGE_NAME = "lexical-fallback"

# ------------------------------------------------------------------------------------------ prompts
# Paper Fig. judge_prompt, verbatim ({c} = edit passage, {s} = subject).
DECOMPOSITION_DEMO = "Please breakdown the following sentence into independent facts: {sentence}\n{facts}\n\n"
DECOMPOSITION_TASK = (
    "Now break down EACH of the following sentences into independent facts. For each sentence, output its "
    "header then one '- fact' line per fact:\n\n"
)
SUPPORT_HEAD = "Answer the questions about {subject} based on the given context.\n\n{passage}\n\n"
SUPPORT_ITEM = "ITEM {i}: Input: {fact} True or False?\n"
SUPPORT_TAIL = (
    "\nThink briefly about each item, then output ONE line per item, in order, EXACTLY like:\n"
    "ITEM 1: <answer>1</answer>\n"
    "(1 = True/supported by the context, 0 = False/not supported)"
)
COVERAGE_HEAD = (
    "You are scoring atomic sub-questions. For each item, judge whether the model ANSWER expresses the "
    "EXPECTED FACT for that sub-question.\n\n"
    "The expected fact is knowledge the model was deliberately given; it may be COUNTERFACTUAL (it can "
    "contradict real-world knowledge on purpose). Judge ONLY whether the answer expresses the expected fact "
    "-- never penalize the answer for disagreeing with reality, and never reward real-world-correct content "
    "that is not the expected fact.\n\n"
)
COVERAGE_ITEM = "ITEM {i}:\n  Sub-question: {question}\n  Expected fact: {expected}\n  Model answer: {answer}\n"
COVERAGE_TAIL = (
    "\nFor each item, output <score>1</score> if the answer states or clearly entails that expected fact, "
    "otherwise <score>0</score>. Then add one sentence <explanation>. Output one line per item, in the given "
    "order, formatted exactly like this:\n\n"
    "ITEM 1: <score>SCORE</score> <explanation>EXPLANATION</explanation>\n"
    "ITEM 2: <score>SCORE</score> <explanation>EXPLANATION</explanation>\n"
    "..."
)

# FActScore-style decomposition demonstrations (a sentence and its '- fact' lines), written for this
# project. The first FIXED_DEMOS are always shown; one more is retrieved from the rest by BM25.
DEMONSTRATIONS: list[tuple[str, list[str]]] = [
    (
        "Maria Lopez (born 3 May 1961) is a Chilean architect who designed the Valparaiso harbour museum.",
        [
            "Maria Lopez was born on 3 May 1961.",
            "Maria Lopez is Chilean.",
            "Maria Lopez is an architect.",
            "Maria Lopez designed the Valparaiso harbour museum.",
        ],
    ),
    (
        "She studied law at the University of Toronto and later worked as a prosecutor in Ottawa.",
        [
            "She studied law.",
            "She studied at the University of Toronto.",
            "She later worked as a prosecutor.",
            "She worked in Ottawa.",
        ],
    ),
    (
        "The band released its debut album, Northern Lights, in 1998 and toured Europe the following year.",
        [
            "The band released a debut album.",
            "The band's debut album is Northern Lights.",
            "Northern Lights was released in 1998.",
            "The band toured Europe in 1999.",
        ],
    ),
    (
        "He served two terms as mayor of Leeds before being elected to Parliament in 2005.",
        [
            "He served as mayor of Leeds.",
            "He served two terms as mayor.",
            "He was elected to Parliament.",
            "He was elected to Parliament in 2005.",
            "He was mayor of Leeds before he was elected to Parliament.",
        ],
    ),
    (
        "Known for her detective novels, Anne Berg has won the Glass Key award twice.",
        [
            "Anne Berg is known for her detective novels.",
            "Anne Berg writes detective novels.",
            "Anne Berg has won the Glass Key award.",
            "Anne Berg has won the Glass Key award twice.",
        ],
    ),
    (
        "The company, founded by two engineers in Osaka, makes batteries for electric bicycles.",
        [
            "The company was founded by two engineers.",
            "The company was founded in Osaka.",
            "The company makes batteries.",
            "The company's batteries are for electric bicycles.",
        ],
    ),
    (
        "He is a retired goalkeeper who played for Ajax and the Dutch national team.",
        [
            "He is retired.",
            "He is a goalkeeper.",
            "He played for Ajax.",
            "He played for the Dutch national team.",
        ],
    ),
    (
        "The river rises in the Alps, flows north through three countries and empties into the North Sea.",
        [
            "The river rises in the Alps.",
            "The river flows north.",
            "The river flows through three countries.",
            "The river empties into the North Sea.",
        ],
    ),
    (
        "The novel, set in 1920s Shanghai, follows a young journalist who uncovers a smuggling ring.",
        [
            "The novel is set in Shanghai.",
            "The novel is set in the 1920s.",
            "The novel follows a young journalist.",
            "The journalist uncovers a smuggling ring.",
        ],
    ),
    (
        "Water boils at 100 degrees Celsius at sea level, but at a lower temperature on high mountains.",
        [
            "Water boils at 100 degrees Celsius at sea level.",
            "Water boils at a lower temperature on high mountains.",
        ],
    ),
    (
        "The species is native to Madagascar, feeds mainly on insects and is active at night.",
        [
            "The species is native to Madagascar.",
            "The species feeds mainly on insects.",
            "The species is active at night.",
        ],
    ),
    (
        "As chief executive from 2010 to 2016, she doubled the firm's revenue and opened offices in Brazil.",
        [
            "She was chief executive.",
            "She was chief executive from 2010 to 2016.",
            "She doubled the firm's revenue.",
            "She opened offices in Brazil.",
        ],
    ),
]
FIXED_DEMOS = 7

_STOPWORDS = frozenset(
    "a an the and or but if of to in on at by for with from as into about over under after before "
    "between through during is are was were be been being has have had do does did will would shall "
    "should can could may might must it its this that these those there here he she they them his her "
    "their we our you your i me my not no yes so than then also very just what which who whom whose "
    "when where why how all any each both more most other some such only own same too s".split()
)
_CONTENT_RE = re.compile(r"\w+", re.UNICODE)


class JudgeError(RuntimeError):
    """The judge endpoint failed for good (bad key, unknown model, retries exhausted)."""


class JudgeRefusedError(JudgeError):
    """The endpoint refused the request itself (HTTP 4xx: key, model name): asking again cannot help."""


def _content_words(text: str) -> list[str]:
    return [w for w in _CONTENT_RE.findall(text.lower()) if w not in _STOPWORDS]


def _bm25_best(query: str, documents: Sequence[str], k1: float = 1.5, b: float = 0.75) -> int:
    """Index of the document with the highest Okapi BM25 score for ``query`` (first on ties)."""
    docs = [_CONTENT_RE.findall(d.lower()) for d in documents]
    avgdl = sum(map(len, docs)) / len(docs)
    n = len(docs)
    df: dict[str, int] = {}
    for d in docs:
        for w in set(d):
            df[w] = df.get(w, 0) + 1
    terms = _CONTENT_RE.findall(query.lower())
    scores = []
    for d in docs:
        s = 0.0
        for w in terms:
            tf = d.count(w)
            if tf:
                idf = math.log(1 + (n - df[w] + 0.5) / (df[w] + 0.5))
                s += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(d) / avgdl))
        scores.append(s)
    return max(range(n), key=lambda i: (scores[i], -i))


def build_decomposition_prompt(sentences: Sequence[str]) -> str:
    """The FActScore decomposition prompt for all sentences of one answer."""
    pool = DEMONSTRATIONS[FIXED_DEMOS:]
    retrieved = pool[_bm25_best(" ".join(sentences), [s for s, _ in pool])]
    demos = DEMONSTRATIONS[:FIXED_DEMOS] + [retrieved]
    text = "".join(
        DECOMPOSITION_DEMO.format(sentence=s, facts="\n".join(f"- {f}" for f in facts)) for s, facts in demos
    )
    text += DECOMPOSITION_TASK
    text += "".join(f"Sentence {i}: {s}\n" for i, s in enumerate(sentences, 1))
    return text


def build_support_prompt(subject: str, passage: str, facts: Sequence[str]) -> str:
    """The FActScore support-validation prompt: every fact of one answer against the edit passage."""
    items = "".join(SUPPORT_ITEM.format(i=i, fact=f) for i, f in enumerate(facts, 1))
    return SUPPORT_HEAD.format(subject=subject, passage=passage) + items + SUPPORT_TAIL


def build_coverage_prompt(items: Sequence["CoverageItem"]) -> str:
    """The decomposed-recall coverage prompt for all sub-questions of one case."""
    body = "".join(
        COVERAGE_ITEM.format(i=i, question=it.question, expected=it.expected, answer=it.answer)
        for i, it in enumerate(items, 1)
    )
    return COVERAGE_HEAD + body + COVERAGE_TAIL


# ------------------------------------------------------------------------------------------ parsing
@dataclass
class Parsed(Generic[T]):
    """A parsed judge answer; ``complete`` is False when something the prompt asked for is missing."""

    value: T
    complete: bool


_BULLET_RE = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+(.*\S)\s*$")
_HEADER_RE = re.compile(r"^\s*\**\s*sentence\s*(\d+)\s*\**\s*:", re.IGNORECASE)


def parse_decomposition(text: str, n_sentences: int) -> Parsed[list[str]]:
    """Atomic facts from a decomposition answer: every '- fact' line (de-duplicated, order kept).

    Complete when there is at least one fact and, if the judge wrote ``Sentence k:`` headers, every
    sentence header appears (a truncated answer loses the last ones).
    """
    facts: list[str] = []
    headers: set[int] = set()
    for line in text.splitlines():
        h = _HEADER_RE.match(line)
        if h:
            headers.add(int(h.group(1)))
            line = line[h.end():]
        m = _BULLET_RE.match(line)
        if m and m.group(1) not in facts:
            facts.append(m.group(1))
    complete = bool(facts) and (not headers or headers >= set(range(1, n_sentences + 1)))
    return Parsed(facts, complete)


_TRUE = {"1", "true", "yes", "supported"}
_FALSE = {"0", "false", "no", "not supported", "unsupported"}


def _item_values(text: str, tag: str, n_items: int) -> dict[int, int]:
    """``ITEM k: ... <tag>v</tag>`` verdicts; the last one per item wins (reasoning may come first)."""
    found: dict[int, int] = {}
    pattern = re.compile(rf"ITEM\s*(\d+)\s*:?[^\n<]*<{tag}>\s*([^<]*?)\s*</{tag}>", re.IGNORECASE)
    for m in pattern.finditer(text):
        i, raw = int(m.group(1)), m.group(2).strip().lower().strip("*. ")
        if 1 <= i <= n_items and (raw in _TRUE or raw in _FALSE):
            found[i] = int(raw in _TRUE)
    return found


def parse_support(text: str, n_facts: int) -> Parsed[list[int | None]]:
    """Per-fact support verdicts (1/0, None where the answer has no verdict for that item)."""
    found = _item_values(text, "answer", n_facts)
    return Parsed([found.get(i) for i in range(1, n_facts + 1)], len(found) == n_facts)


def parse_coverage(text: str, n_items: int) -> Parsed[list[int | None]]:
    """Per-sub-question coverage scores (1/0, None where the answer has no score for that item)."""
    found = _item_values(text, "score", n_items)
    return Parsed([found.get(i) for i in range(1, n_items + 1)], len(found) == n_items)


# ------------------------------------------------------------------------------------------ cache + client
class ResponseCache:
    """Well-formed judge answers on disk (SQLite), keyed by a hash of the model and the exact request."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path)
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, model TEXT, response TEXT, created REAL)"
        )
        self._db.commit()

    @staticmethod
    def key(model: str, request: dict) -> str:
        payload = json.dumps({"model": model, **request}, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()

    def get(self, key: str) -> str | None:
        row = self._db.execute("SELECT response FROM responses WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def put(self, key: str, model: str, response: str) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?)", (key, model, response, time.time())
        )
        self._db.commit()

    def close(self) -> None:
        self._db.close()


@dataclass
class JudgeSettings:
    """Where the judge lives. Unset fields come from the environment (see ``resolve``)."""

    base_url: str | None = None
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)
    timeout: float = 120.0
    max_attempts: int = 6
    backoff: float = 2.0
    max_backoff: float = 60.0
    temperature: float = 0.0
    max_tokens: int | None = None
    cache_path: str | None = None

    DEFAULT_MODEL = "gemini-2.5-flash"

    def resolve(self) -> "JudgeSettings":
        """Fill unset fields: ``HPSE_JUDGE_BASE_URL`` / ``OPENAI_BASE_URL``, ``HPSE_JUDGE_MODEL`` (default
        ``gemini-2.5-flash``, the paper's judge), ``HPSE_JUDGE_API_KEY`` / ``OPENAI_API_KEY``."""
        env = os.environ
        return JudgeSettings(
            base_url=self.base_url or env.get("HPSE_JUDGE_BASE_URL") or env.get("OPENAI_BASE_URL"),
            model=self.model or env.get("HPSE_JUDGE_MODEL") or self.DEFAULT_MODEL,
            api_key=self.api_key or env.get("HPSE_JUDGE_API_KEY") or env.get("OPENAI_API_KEY"),
            timeout=self.timeout,
            max_attempts=self.max_attempts,
            backoff=self.backoff,
            max_backoff=self.max_backoff,
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            cache_path=self.cache_path,
        )

    @property
    def configured(self) -> bool:
        """True when an endpoint is reachable in principle: a base URL or an API key is set."""
        return bool(self.base_url or self.api_key)


class ChatClient:
    """One-message chat completions with retries, backoff, re-asking on malformed answers, and a cache."""

    def __init__(self, settings: JudgeSettings, sleep: Callable[[float], None] = time.sleep) -> None:
        import openai

        settings = settings.resolve()
        if not settings.configured:
            raise JudgeError(
                "no judge endpoint: set --judge-base-url (or HPSE_JUDGE_BASE_URL / OPENAI_BASE_URL) and, if the "
                "endpoint needs one, an API key in HPSE_JUDGE_API_KEY or OPENAI_API_KEY; or use --judge lexical"
            )
        if settings.max_attempts < 1:
            raise ValueError(f"judge max_attempts must be >= 1, got {settings.max_attempts}")
        self.settings = settings
        self.model = str(settings.model)
        self._openai = openai
        # A local server needs no key, but the client insists on one.
        self._client = openai.OpenAI(
            base_url=settings.base_url, api_key=settings.api_key or "no-key", timeout=settings.timeout, max_retries=0
        )
        self.cache = ResponseCache(settings.cache_path) if settings.cache_path else None
        self._sleep = sleep
        self.stats = {"requests": 0, "cache_hits": 0, "retries": 0, "malformed": 0}

    @property
    def name(self) -> str:
        return f"llm:{self.model}"

    def _request(self, prompt: str) -> dict:
        req: dict[str, Any] = {"messages": [{"role": "user", "content": prompt}], "temperature": self.settings.temperature}
        if self.settings.max_tokens is not None:
            req["max_tokens"] = self.settings.max_tokens
        return req

    def _retryable(self, err: Exception) -> bool:
        o = self._openai
        if isinstance(err, (o.APITimeoutError, o.APIConnectionError, o.RateLimitError, o.InternalServerError)):
            return True
        return isinstance(err, o.APIStatusError) and err.status_code >= 500

    def complete(self, prompt: str, parse: Callable[[str], Parsed[T]]) -> Parsed[T]:
        """Ask ``prompt`` and parse the answer; a cached well-formed answer is reused without a request.

        Transport errors and malformed answers are retried up to ``max_attempts`` in all, waiting
        ``backoff * 2**k`` seconds (capped) in between. After that the last parsed answer is returned
        with ``complete=False`` (and not cached), or JudgeError is raised when no answer arrived at all.
        """
        request = self._request(prompt)
        key = ResponseCache.key(self.model, request)
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                self.stats["cache_hits"] += 1
                return parse(hit)
        last: Parsed[T] | None = None
        last_error: Exception | None = None
        for attempt in range(self.settings.max_attempts):
            if attempt:
                self.stats["retries"] += 1
                self._sleep(min(self.settings.max_backoff, self.settings.backoff * 2 ** (attempt - 1)))
            self.stats["requests"] += 1
            try:
                resp = self._client.chat.completions.create(model=self.model, **request)
                text = _completion_text(resp)
            except (ValueError, self._openai.APIResponseValidationError) as err:  # HTTP 200, body not a chat completion
                last_error = err
                self.stats["malformed"] += 1
                log.warning("judge answer is not a chat completion (attempt %d/%d): %s", attempt + 1,
                            self.settings.max_attempts, err)
                continue
            except self._openai.APIStatusError as err:
                if not self._retryable(err):
                    raise JudgeRefusedError(
                        f"judge endpoint {self.settings.base_url or '(OpenAI default)'} refused the request with "
                        f"HTTP {err.status_code} for model {self.model!r}; check the model name and the API key "
                        "variable (HPSE_JUDGE_API_KEY / OPENAI_API_KEY)"
                    ) from None
                last_error = err
                log.warning("judge HTTP %s (attempt %d/%d)", err.status_code, attempt + 1, self.settings.max_attempts)
                continue
            except self._openai.OpenAIError as err:
                if not self._retryable(err):
                    raise
                last_error = err
                log.warning("judge %s (attempt %d/%d)", type(err).__name__, attempt + 1, self.settings.max_attempts)
                continue
            last = parse(text)
            if last.complete:
                if self.cache is not None:
                    self.cache.put(key, self.model, text)
                return last
            self.stats["malformed"] += 1
            log.warning("judge answer malformed (attempt %d/%d): %.200r", attempt + 1, self.settings.max_attempts, text)
        if last is None:
            raise JudgeError(
                f"judge endpoint {self.settings.base_url or '(OpenAI default)'} failed {self.settings.max_attempts} "
                f"times, last error: {type(last_error).__name__}: {last_error}"
            )
        log.warning("judge answer still malformed after %d attempts; keeping what parsed", self.settings.max_attempts)
        return last

    def probe(self) -> None:
        """One cheap request (``GET {base_url}/models``, no tokens spent) that fails fast when the endpoint is unreachable
        or refuses the API key, so a run stops before its first edit rather than after it. Any other answer,
        even an error status of a server without that route, shows the endpoint is there."""
        o = self._openai
        where = self.settings.base_url or "(OpenAI default)"
        try:
            self._client.with_options(timeout=min(self.settings.timeout, 15.0), max_retries=0).models.list()
        except (o.AuthenticationError, o.PermissionDeniedError) as err:
            raise JudgeError(
                f"judge endpoint {where} refused the API key (HTTP {err.status_code}); set the right key in "
                "HPSE_JUDGE_API_KEY or OPENAI_API_KEY, or use --judge lexical"
            ) from None
        except (o.APIConnectionError, o.APITimeoutError) as err:
            raise JudgeError(
                f"judge endpoint {where} is unreachable ({type(err).__name__}: {err}); start it or fix --judge-base-url "
                "(HPSE_JUDGE_BASE_URL / OPENAI_BASE_URL), or use --judge lexical"
            ) from None
        except Exception:  # noqa: BLE001 - the server answered (404/501/unparsable body): it is there
            pass

    def ask_text(self, prompt: str) -> str:
        """A free-text answer (first non-empty line, stripped of quotes); for subject/passage generation."""

        def parse(text: str) -> Parsed[str]:
            cleaned = text.strip().strip('"').strip()
            return Parsed(cleaned, bool(cleaned))

        out = self.complete(prompt, parse)
        if not out.complete:
            raise JudgeError(f"judge model {self.model!r} returned empty text {self.settings.max_attempts} times")
        return out.value

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()
        self._client.close()


class _NotACompletion(ValueError):
    """The endpoint answered HTTP 200 with something that is not a chat completion."""


def _completion_text(resp: Any) -> str:
    """The message text of a chat-completion response; ``_NotACompletion`` for anything else (a string body, HTML)."""
    choices = getattr(resp, "choices", None)
    if choices is None:
        raise _NotACompletion(f"the response body is not a chat completion: {str(resp)[:120]!r}")
    if not choices:
        return ""
    message = getattr(choices[0], "message", None)
    content = getattr(message, "content", None)
    if content is not None and not isinstance(content, str):
        raise _NotACompletion(f"the message content is {type(content).__name__}, not text")
    return content or ""


# ------------------------------------------------------------------------------------------ judges
@dataclass
class CoverageItem:
    """One Dmp sub-question: the question, the gold ``sub_answer`` and the model's answer."""

    question: str
    expected: str
    answer: str


@dataclass
class FactScoreResult:
    """FActScore of one answer: its atomic facts, the judge's verdicts and the supported fraction."""

    facts: list[str]
    supported: list[bool]
    score: float
    complete: bool = True

    def to_dict(self) -> dict:
        return {"facts": self.facts, "supported": self.supported, "score": self.score, "complete": self.complete}


class Judge:
    """What the UnKEBench scorer needs from a judge; ``name`` goes into every record it scores."""

    name: str = "judge"

    def factscore(self, answer: str, passage: str, subject: str) -> FactScoreResult:
        raise NotImplementedError

    def coverage(self, items: Sequence[CoverageItem]) -> tuple[list[int], bool]:
        """Binary scores per item and whether the judge answered every item."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the endpoint and the cache."""


class LLMJudge(Judge):
    """The paper's judge: FActScore decomposition + support validation, and the Dmp coverage prompt."""

    def __init__(self, client: ChatClient) -> None:
        self.client = client
        self.name = client.name

    def factscore(self, answer: str, passage: str, subject: str) -> FactScoreResult:
        sentences = split_sentences(answer)
        if not sentences:
            return FactScoreResult([], [], 0.0)
        decomposed = self.client.complete(
            build_decomposition_prompt(sentences), lambda t: parse_decomposition(t, len(sentences))
        )
        facts = decomposed.value
        if not facts:
            return FactScoreResult([], [], 0.0, complete=decomposed.complete)
        verdicts = self.client.complete(
            build_support_prompt(subject, passage, facts), lambda t: parse_support(t, len(facts))
        )
        supported = [v == 1 for v in verdicts.value]
        return FactScoreResult(facts, supported, supported_fraction(supported), decomposed.complete and verdicts.complete)

    def coverage(self, items: Sequence[CoverageItem]) -> tuple[list[int], bool]:
        if not items:
            return [], True
        scores = self.client.complete(build_coverage_prompt(items), lambda t: parse_coverage(t, len(items)))
        return [int(v == 1) for v in scores.value], scores.complete

    def close(self) -> None:
        self.client.close()


class LexicalJudge(Judge):
    """Offline stand-in: content-word overlap instead of an LLM. Coarse; named ``lexical-fallback``."""

    name = LEXICAL_JUDGE_NAME

    def __init__(self, support_threshold: float = 0.6, coverage_threshold: float = 0.5) -> None:
        self.support_threshold = support_threshold
        self.coverage_threshold = coverage_threshold

    @staticmethod
    def _recall(words: Sequence[str], pool: set[str]) -> float:
        return sum(w in pool for w in words) / len(words) if words else 0.0

    def factscore(self, answer: str, passage: str, subject: str) -> FactScoreResult:
        """Facts = the answer's sentences with content words; supported = >= threshold of them in the passage."""
        pool = set(_content_words(passage))
        facts = [s for s in split_sentences(answer) if _content_words(s)]
        supported = [self._recall(_content_words(f), pool) >= self.support_threshold for f in facts]
        return FactScoreResult(facts, supported, supported_fraction(supported))

    def coverage(self, items: Sequence[CoverageItem]) -> tuple[list[int], bool]:
        """1 when >= threshold of the expected answer's content words (those not already in the question,
        unless that leaves none) occur in the model answer."""
        scores = []
        for it in items:
            expected = _content_words(it.expected)
            asked = set(_content_words(it.question))
            new = [w for w in expected if w not in asked] or expected
            scores.append(int(bool(new) and self._recall(new, set(_content_words(it.answer))) >= self.coverage_threshold))
        return scores, True


def make_judge(kind: str, settings: JudgeSettings, warn: bool = True) -> Judge:
    """``kind``: 'llm' (needs an endpoint), 'lexical', or 'auto' (llm when an endpoint is configured).

    ``warn=False`` leaves the warning about the lexical fallback to the caller (the runner logs it after
    its pre-flight checks, so a bad option is the only line a user sees).
    """
    if kind not in {"auto", "llm", "lexical"}:
        raise ValueError(f"--judge must be auto, llm or lexical, got {kind!r}")
    if kind == "lexical" or (kind == "auto" and not settings.resolve().configured):
        if kind == "auto" and warn:
            log.warning(
                "no judge endpoint configured (--judge-base-url / HPSE_JUDGE_BASE_URL / OPENAI_BASE_URL or an API "
                "key): scoring UnKEBench with the offline LEXICAL FALLBACK judge; its Jnt/Dmp are not the paper's"
            )
        return LexicalJudge()
    client = ChatClient(settings)
    if warn:
        log.info("judge: %s at %s", client.name, client.settings.base_url or "the OpenAI default URL")
    return LLMJudge(client)
