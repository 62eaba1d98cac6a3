"""The one way the benchmarks ask an LLM: one-message chats to any OpenAI-compatible endpoint, with
one cache.

``ChatClient`` sends through the ``openai`` package, which itself retries timeouts, connection
errors, 408/409/429 and 5xx answers with its own exponential backoff (its ``max_retries``). What is
ours is re-asking when an answer arrived but cannot be parsed (or is not a chat completion at all);
a library client cannot know our answer format. ``--judge-max-attempts`` bounds the requests one
question may cost in all, transport retries and re-asks together.

``--judge-timeout`` bounds each request as a whole: httpx's timeouts bound each network read, so
an endpoint that sends one byte a second never trips them; the client's transport gives every read,
write and connect of a request only the time left until its deadline (``deadline_transport``).

Every well-formed answer is kept in ``ResponseCache`` (SQLite, keyed by the model and the exact
request), so a rerun of the same evaluation, or of the same subject or passage generation, sends
nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generic, TypeVar

__all__ = [
    "ChatClient",
    "deadline_transport",
    "JudgeError",
    "JudgeRefusedError",
    "JudgeSettings",
    "Parsed",
    "ResponseCache",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


class JudgeError(RuntimeError):
    """The judge endpoint failed for good (bad key, unknown model, retries exhausted)."""


class JudgeRefusedError(JudgeError):
    """The endpoint refused the request itself (HTTP 4xx: key, model name): asking again cannot
    help."""


@dataclass
class Parsed(Generic[T]):
    """A parsed LLM answer; ``complete`` is False when something the prompt asked for is missing."""

    value: T
    complete: bool


class ResponseCache:
    """Well-formed LLM answers on disk (SQLite), keyed by a hash of the model and the exact
    request."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path)
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS responses (key TEXT "
                "PRIMARY KEY, model TEXT, response TEXT, created REAL)"
            )
            self._db.commit()
        except (OSError, sqlite3.Error) as err:
            raise JudgeError(
                f"judge cache {self.path}: cannot be written ({err}); set --cache-dir or "
                "HPSE_CACHE_DIR to a writable directory"
            ) from None

    @staticmethod
    def key(model: str, request: dict) -> str:
        payload = json.dumps({"model": model, **request}, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()

    def get(self, key: str) -> str | None:
        row = self._db.execute("SELECT response FROM responses WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def put(self, key: str, model: str, response: str) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?)",
            (key, model, response, time.time()),
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
    temperature: float = 0.0
    max_tokens: int | None = None
    cache_path: str | None = None

    DEFAULT_MODEL = "gemini-2.5-flash"

    def resolve(self) -> "JudgeSettings":
        """Fill unset fields: ``HPSE_JUDGE_BASE_URL`` / ``OPENAI_BASE_URL``, ``HPSE_JUDGE_MODEL``
        (default ``gemini-2.5-flash``, the paper's judge), ``HPSE_JUDGE_API_KEY`` /
        ``OPENAI_API_KEY``."""
        env = os.environ
        return JudgeSettings(
            base_url=self.base_url or env.get("HPSE_JUDGE_BASE_URL") or env.get("OPENAI_BASE_URL"),
            model=self.model or env.get("HPSE_JUDGE_MODEL") or self.DEFAULT_MODEL,
            api_key=self.api_key or env.get("HPSE_JUDGE_API_KEY") or env.get("OPENAI_API_KEY"),
            timeout=self.timeout,
            max_attempts=self.max_attempts,
            temperature=self.temperature,
            max_tokens=self.max_tokens,
            cache_path=self.cache_path,
        )

    @property
    def configured(self) -> bool:
        """True when an endpoint is reachable in principle: a base URL or an API key is set."""
        return bool(self.base_url or self.api_key)


class _Deadline(threading.local):
    """When the request this thread is sending must be done (``time.monotonic()``), or None."""

    at: float | None = None

    def bound(self, timeout: float | None, expired: type[Exception]) -> float | None:
        """``timeout`` cut to the time left; ``expired`` when none is left."""
        if self.at is None:
            return timeout
        left = self.at - time.monotonic()
        if left <= 0:
            raise expired("the request as a whole took longer than the judge timeout")
        return left if timeout is None else min(timeout, left)


def _deadline_backend(inner: Any, deadline: _Deadline) -> Any:
    """``inner`` (httpcore's network backend) with every connect, read and write bounded by
    ``deadline``."""
    import httpcore2

    class Stream(httpcore2.NetworkStream):
        def __init__(self, stream: Any) -> None:
            self.stream = stream

        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            return self.stream.read(max_bytes, deadline.bound(timeout, httpcore2.ReadTimeout))

        def write(self, buffer: bytes, timeout: float | None = None) -> None:
            self.stream.write(buffer, deadline.bound(timeout, httpcore2.WriteTimeout))

        def close(self) -> None:
            self.stream.close()

        def start_tls(
            self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
        ) -> Any:
            bounded = deadline.bound(timeout, httpcore2.ConnectTimeout)
            return Stream(self.stream.start_tls(ssl_context, server_hostname, bounded))

        def get_extra_info(self, info: str) -> Any:
            return self.stream.get_extra_info(info)

    class Backend(httpcore2.NetworkBackend):
        def connect_tcp(self, host: str, port: int, timeout: float | None = None, **kw: Any) -> Any:
            bounded = deadline.bound(timeout, httpcore2.ConnectTimeout)
            return Stream(inner.connect_tcp(host, port, bounded, **kw))

        def connect_unix_socket(self, path: str, timeout: float | None = None, **kw: Any) -> Any:
            bounded = deadline.bound(timeout, httpcore2.ConnectTimeout)
            return Stream(inner.connect_unix_socket(path, bounded, **kw))

        def sleep(self, seconds: float) -> None:
            inner.sleep(seconds)

    return Backend()


def deadline_transport(seconds: float, **kwargs: Any) -> Any:
    """An ``httpx2.HTTPTransport`` (``kwargs``) whose every request, from connecting to its last
    byte, must be done within ``seconds``; past that its next read or write raises httpx's
    ``ReadTimeout`` / ``WriteTimeout``, which the openai client retries as any timeout. The body is
    read by the same thread after ``handle_request`` returns, so the deadline stays until that
    thread's next request."""
    import httpx2

    class Transport(httpx2.HTTPTransport):
        def __init__(self) -> None:
            super().__init__(**kwargs)
            self.deadline = _Deadline()
            # httpcore's pool makes each new connection's streams through this backend
            pool = self._pool
            pool._network_backend = _deadline_backend(pool._network_backend, self.deadline)

        def handle_request(self, request: Any) -> Any:
            self.deadline.at = time.monotonic() + seconds
            return super().handle_request(request)

    return Transport()


class _RequestLog:
    """The httpx hooks a ``ChatClient`` gives the openai client: they count every request sent in
    ``stats`` and log the client's own retries (which happen inside one ``create`` call)."""

    def __init__(self, stats: dict[str, int]) -> None:
        self.stats = stats
        self.last_status: int | None = None

    def on_request(self, request: Any) -> None:
        self.stats["requests"] += 1
        retry = int(request.headers.get("x-stainless-retry-count", "0") or 0)
        if retry:
            why = (
                f"HTTP {self.last_status}"
                if self.last_status is not None
                else "a timeout or connection error"
            )
            log.warning(
                "judge request sent again by the openai client after %s (retry %d)", why, retry
            )
        self.last_status = None

    def on_response(self, response: Any) -> None:
        self.last_status = response.status_code


class ChatClient:
    """One-message chat completions: the ``openai`` client's own retries, our re-asking on malformed
    answers, a cache."""

    def __init__(self, settings: JudgeSettings) -> None:
        import openai

        settings = settings.resolve()
        if not settings.configured:
            raise JudgeError(
                "no judge endpoint: set --judge-base-url (or HPSE_JUDGE_BASE_URL / "
                "OPENAI_BASE_URL) and, if the endpoint needs one, an API key in "
                "HPSE_JUDGE_API_KEY or OPENAI_API_KEY; or use --judge lexical"
            )
        if settings.max_attempts < 1:
            raise ValueError(f"judge max_attempts must be >= 1, got {settings.max_attempts}")
        self.settings = settings
        self.model = str(settings.model)
        self._openai = openai
        self.stats = {"requests": 0, "cache_hits": 0, "retries": 0, "malformed": 0}
        # A local server needs no key, but the client insists on one. The hooks only count and log
        # what the client's own retry loop sends.
        hooks = _RequestLog(self.stats)
        http = openai.DefaultHttpxClient(
            event_hooks={"request": [hooks.on_request], "response": [hooks.on_response]},
            transport=deadline_transport(settings.timeout, limits=openai.DEFAULT_CONNECTION_LIMITS),
        )
        self._client = openai.OpenAI(
            base_url=settings.base_url,
            api_key=settings.api_key or "no-key",
            timeout=settings.timeout,
            max_retries=settings.max_attempts - 1,
            http_client=http,
        )
        self.cache = ResponseCache(settings.cache_path) if settings.cache_path else None

    @property
    def name(self) -> str:
        return f"llm:{self.model}"

    def _request(self, prompt: str) -> dict:
        req: dict[str, Any] = {
            "messages": [{"role": "user", "content": prompt}],
            "temperature": self.settings.temperature,
        }
        if self.settings.max_tokens is not None:
            req["max_tokens"] = self.settings.max_tokens
        return req

    def complete(self, prompt: str, parse: Callable[[str], Parsed[T]]) -> Parsed[T]:
        """Ask ``prompt`` and parse the answer; a cached well-formed answer is reused without a
        request.

        At most ``max_attempts`` requests in all: the openai client retries transport errors within
        that budget, and an answer that does not parse (or is not a chat completion) is asked again
        while budget is left. After that the last parsed answer is returned with ``complete=False``
        (and not cached), or JudgeError is raised when no answer arrived at all.
        """
        request = self._request(prompt)
        key = ResponseCache.key(self.model, request)
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                self.stats["cache_hits"] += 1
                return parse(hit)
        first = self.stats["requests"]
        try:
            return self._ask(request, key, parse, first)
        finally:
            self.stats["retries"] += max(0, self.stats["requests"] - first - 1)

    def _ask(
        self, request: dict, key: str, parse: Callable[[str], Parsed[T]], first: int
    ) -> Parsed[T]:
        o, budget = self._openai, self.settings.max_attempts
        where = self.settings.base_url or "(OpenAI default)"
        last: Parsed[T] | None = None
        last_error: Exception | None = None
        while (left := budget - (self.stats["requests"] - first)) > 0:
            client = (
                self._client if left == budget else self._client.with_options(max_retries=left - 1)
            )
            try:
                text = _completion_text(client.chat.completions.create(model=self.model, **request))
            # HTTP 200, body not a chat completion
            except (ValueError, o.APIResponseValidationError) as err:
                last_error = err
                self.stats["malformed"] += 1
                log.warning(
                    "judge answer is not a chat completion (request %d/%d): %s",
                    self.stats["requests"] - first,
                    budget,
                    err,
                )
                continue
            except o.APIStatusError as err:
                _raise_if_refused(err, where, self.model)
                last_error = err
                break  # the client's own retries are spent
            except (o.APITimeoutError, o.APIConnectionError) as err:
                last_error = err
                break
            last = parse(text)
            if last.complete:
                if self.cache is not None:
                    self.cache.put(key, self.model, text)
                return last
            self.stats["malformed"] += 1
            log.warning(
                "judge answer malformed (request %d/%d): %.200r",
                self.stats["requests"] - first,
                budget,
                text,
            )
        if last is None:
            raise JudgeError(
                f"judge endpoint {where} failed {self.stats['requests'] - first} times, last "
                f"error: {type(last_error).__name__}: {last_error}"
            )
        log.warning(
            "judge answer still malformed after %d requests; keeping what parsed",
            self.stats["requests"] - first,
        )
        return last

    def probe(self) -> None:
        """One cheap request that fails fast when the endpoint is unreachable or refuses the API
        key, so a run stops before its first edit rather than after it (``probe_endpoint``)."""
        probe_endpoint(self._client, self._openai, self.settings)

    def ask_text(self, prompt: str) -> str:
        """A free-text answer (stripped of quotes); for subject and passage generation."""

        def parse(text: str) -> Parsed[str]:
            cleaned = text.strip().strip('"').strip()
            return Parsed(cleaned, bool(cleaned))

        out = self.complete(prompt, parse)
        if not out.complete:
            raise JudgeError(
                f"judge model {self.model!r} returned empty text {self.settings.max_attempts} times"
            )
        return out.value

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()
        self._client.close()


class _NotACompletion(ValueError):
    """The endpoint answered HTTP 200 with something that is not a chat completion."""


def _completion_text(resp: Any) -> str:
    """The message text of a chat-completion response; ``_NotACompletion`` for anything else (a
    string body, HTML)."""
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


def probe_endpoint(client: Any, openai: Any, settings: JudgeSettings) -> None:
    """``GET {base_url}/models`` (no tokens spent) through ``client``: a refused API key or an
    unreachable endpoint is a ``JudgeError`` naming the fix. Any other answer, even an error status
    of a server without that route, shows the endpoint is there."""
    where = settings.base_url or "(OpenAI default)"
    try:
        client.with_options(timeout=min(settings.timeout, 15.0), max_retries=0).models.list()
    except (openai.AuthenticationError, openai.PermissionDeniedError) as err:
        raise JudgeError(
            f"judge endpoint {where} refused the API key (HTTP {err.status_code}); set the "
            "right key in HPSE_JUDGE_API_KEY or OPENAI_API_KEY, or use --judge lexical"
        ) from None
    except (openai.APIConnectionError, openai.APITimeoutError) as err:
        raise JudgeError(
            f"judge endpoint {where} is unreachable ({type(err).__name__}: {err}); start it "
            "or fix --judge-base-url (HPSE_JUDGE_BASE_URL "
            "/ OPENAI_BASE_URL), or use --judge lexical"
        ) from None
    except Exception:  # noqa: BLE001 - the server answered (404/501/unparsable body): it is there
        pass


def _raise_if_refused(err: Any, where: str, model: str) -> None:
    """An HTTP error status that asking again cannot mend (4xx but a timeout, a conflict or a rate
    limit) is a ``JudgeRefusedError`` naming what to check."""
    if err.status_code < 500 and err.status_code not in (408, 409, 429):
        raise JudgeRefusedError(
            f"judge endpoint {where} refused the request with HTTP {err.status_code} "
            f"for model {model!r}; check the model name and the API key variable "
            "(HPSE_JUDGE_API_KEY / OPENAI_API_KEY)"
        ) from None
