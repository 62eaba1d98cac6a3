"""Test helpers for the benchmark tests: a local OpenAI-compatible chat server and tiny-run setup.

``ChatServer`` listens on 127.0.0.1 (a free port) and speaks the chat-completions protocol the
``openai`` package uses. Each request is answered by the next scripted action, then by a responder
function of the prompt: so a test can make the judge endpoint time out, fail with a 500, answer
garbage, then answer well, and count what the client actually sent.
"""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"
DATA_DIR = Path(os.environ.get("HPSE_DATA_DIR", DEFAULT_DATA_DIR))


class ChatServer:
    """A local chat-completions endpoint. Actions: ("sleep", seconds), ("status", code), ("text",
    content), ("raw", body, content type), ("drip", seconds): the whole answer, status line and
    headers included, one byte every that many seconds."""

    def __init__(self, responder: Callable[[str], str] | None = None) -> None:
        self.script: list[tuple] = []
        self.responder = responder or (lambda prompt: "ok")
        self.prompts: list[str] = []
        self.auth_headers: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):  # noqa: N802 (http.server naming)
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                prompt = body["messages"][-1]["content"]
                server.prompts.append(prompt)
                server.auth_headers.append(self.headers.get("Authorization", ""))
                action = (
                    server.script.pop(0) if server.script else ("text", server.responder(prompt))
                )
                try:
                    if action[0] == "drip":
                        self.drip = action[1]
                        action = ("text", server.responder(prompt))
                    if action[0] == "sleep":
                        time.sleep(action[1])
                        action = ("text", server.responder(prompt))
                    if action[0] == "status":
                        self._send(
                            action[1],
                            {"error": {"message": "scripted failure", "type": "server_error"}},
                        )
                        return
                    if (
                        action[0] == "raw"
                    ):  # ("raw", body text, content type): HTTP 200 with any body
                        self._send_bytes(200, action[1].encode(), action[2])
                        return
                    self._send(
                        200,
                        {
                            "id": f"chatcmpl-{len(server.prompts)}",
                            "object": "chat.completion",
                            "created": int(time.time()),
                            "model": body["model"],
                            "choices": [
                                {
                                    "index": 0,
                                    "message": {"role": "assistant", "content": action[1]},
                                    "finish_reason": "stop",
                                }
                            ],
                            "usage": {
                                "prompt_tokens": 1,
                                "completion_tokens": 1,
                                "total_tokens": 2,
                            },
                        },
                    )
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass

            def _send(self, code: int, obj: dict) -> None:
                self._send_bytes(code, json.dumps(obj).encode(), "application/json")

            drip = 0.0

            def _send_bytes(self, code: int, data: bytes, content_type: str) -> None:
                if self.drip:
                    head = (
                        f"HTTP/1.1 {code} OK\r\nContent-Type: {content_type}\r\n"
                        f"Content-Length: {len(data)}\r\n\r\n"
                    )
                    for byte in head.encode() + data:
                        self.wfile.write(bytes([byte]))
                        time.sleep(self.drip)
                    return
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> "ChatServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def judge_like_responder(prompt: str) -> str:
    """Well-formed answers to the three judge prompts and to subject/passage generation requests."""
    import re

    if "Now break down EACH of the following sentences" in prompt:
        sentences = re.findall(r"^Sentence (\d+): (.*)$", prompt, re.MULTILINE)
        return "\n".join(f"Sentence {i}: {s}\n- {s}" for i, s in sentences)
    if "True or False?" in prompt:
        n = len(re.findall(r"^ITEM \d+: Input:", prompt, re.MULTILINE))
        return "\n".join(f"ITEM {i}: <answer>{i % 2}</answer>" for i in range(1, n + 1))
    if "You are scoring atomic sub-questions" in prompt:
        n = len(re.findall(r"^ITEM \d+:\n", prompt, re.MULTILINE))
        return "\n".join(
            f"ITEM {i}: <score>1</score> <explanation>fine.</explanation>" for i in range(1, n + 1)
        )
    if "name its topic" in prompt:
        return "Generated Topic"
    return "A generated passage stating the fact."


JUDGE_ENV = (
    "HPSE_JUDGE_BASE_URL",
    "OPENAI_BASE_URL",
    "HPSE_JUDGE_API_KEY",
    "OPENAI_API_KEY",
    "HPSE_JUDGE_MODEL",
)


def isolate_judge_env(monkeypatch, tmp_path: Path) -> None:
    """No judge endpoint from the developer's environment, and a cache directory of the test's
    own."""
    for var in JUDGE_ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HPSE_CACHE_DIR", str(tmp_path / "cache"))
