"""A local fake of the Gemini API's `generateContent`, for the real google-genai SDK.

Point a client at it with `HttpOptions(base_url=fake.url, api_version="v1beta")`. It answers
from a script of `FakeReply`s (then from a default reply), with bodies shaped like the real
API's, and records every request so tests can assert what the SDK sent.
"""

from __future__ import annotations

import json
import re
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

import pytest

_PATH = re.compile(r"^/v1beta/models/(?P<model>[^/:]+):generateContent$")

# google.rpc status names the real API puts in its error bodies.
_RPC_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


@dataclass(frozen=True)
class FakeReply:
    """One scripted answer: an HTTP status, a JSON body, and how long to wait first."""

    http_status: int
    body: dict[str, Any]
    delay_seconds: float = 0.0

    @classmethod
    def text(
        cls,
        raw_text: str,
        finish_reason: str = "STOP",
        prompt_tokens: int = 100,
        completion_tokens: int = 50,
        thoughts_tokens: int | None = None,
        model_version: str = "gemini-2.5-flash",
    ) -> FakeReply:
        """A candidate whose only part is `raw_text`, as the model wrote it."""
        usage: dict[str, Any] = {
            "promptTokenCount": prompt_tokens,
            "candidatesTokenCount": completion_tokens,
            "totalTokenCount": prompt_tokens + completion_tokens + (thoughts_tokens or 0),
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt_tokens}],
        }
        if thoughts_tokens is not None:
            usage["thoughtsTokenCount"] = thoughts_tokens
        candidate = {
            "content": {"parts": [{"text": raw_text}], "role": "model"},
            "finishReason": finish_reason,
            "index": 0,
        }
        return cls(200, _response_body([candidate], usage, model_version))

    @classmethod
    def json(
        cls,
        payload: Any,
        prompt_tokens: int = 100,
        completion_tokens: int = 50,
        thoughts_tokens: int | None = None,
    ) -> FakeReply:
        """A well-formed answer whose text is `payload` serialized as JSON."""
        return cls.text(
            json.dumps(payload),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            thoughts_tokens=thoughts_tokens,
        )

    @classmethod
    def status(cls, code: int, message: str | None = None) -> FakeReply:
        """An error answer with the real API's `{"error": {code, message, status}}` body."""
        text = message or HTTPStatus(code).phrase
        error = {"code": code, "message": text, "status": _RPC_STATUS.get(code, "UNKNOWN")}
        return cls(code, {"error": error})

    @classmethod
    def blocked(cls, reason: str = "SAFETY", prompt_tokens: int = 100) -> FakeReply:
        """The prompt itself was blocked: no candidates, only `promptFeedback`."""
        usage = {"promptTokenCount": prompt_tokens, "totalTokenCount": prompt_tokens}
        body = _response_body(None, usage, "gemini-2.5-flash")
        body["promptFeedback"] = {"blockReason": reason}
        return cls(200, body)

    @classmethod
    def no_candidates(cls) -> FakeReply:
        usage = {"promptTokenCount": 100, "totalTokenCount": 100}
        return cls(200, _response_body([], usage, "gemini-2.5-flash"))

    @classmethod
    def no_text(cls, finish_reason: str = "MAX_TOKENS", thoughts_tokens: int = 8192) -> FakeReply:
        """A candidate with no parts: what 2.5 models return when thinking ate the budget."""
        candidate = {"content": {"role": "model"}, "finishReason": finish_reason, "index": 0}
        usage = {
            "promptTokenCount": 100,
            "totalTokenCount": 100 + thoughts_tokens,
            "thoughtsTokenCount": thoughts_tokens,
        }
        return cls(200, _response_body([candidate], usage, "gemini-2.5-flash"))

    @classmethod
    def delay(cls, seconds: float, then: FakeReply | None = None) -> FakeReply:
        """`then` (by default an empty JSON object answer) sent after `seconds`."""
        return replace(then or cls.text("{}"), delay_seconds=seconds)


def _response_body(
    candidates: list[dict[str, Any]] | None, usage: dict[str, Any], model_version: str
) -> dict[str, Any]:
    body: dict[str, Any] = {"usageMetadata": usage, "modelVersion": model_version}
    if candidates is not None:
        body["candidates"] = candidates
    body["responseId"] = "fake-response-id"
    return body


@dataclass(frozen=True)
class RecordedRequest:
    path: str
    model: str
    headers: dict[str, str]
    body: dict[str, Any]

    @property
    def generation_config(self) -> dict[str, Any]:
        config: dict[str, Any] = self.body.get("generationConfig", {})
        return config

    @property
    def system_text(self) -> str:
        parts = self.body.get("systemInstruction", {}).get("parts", [])
        return "".join(p.get("text", "") for p in parts)

    @property
    def user_text(self) -> str:
        return "".join(
            p.get("text", "") for c in self.body.get("contents", []) for p in c.get("parts", [])
        )


@dataclass
class FakeGemini:
    """The fake server; use as a context manager (or through the `fake_gemini` fixture)."""

    default: FakeReply = field(default_factory=lambda: FakeReply.status(500, "no reply scripted"))
    requests: list[RecordedRequest] = field(default_factory=list, init=False)
    _script: deque[FakeReply] = field(default_factory=deque, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _closing: threading.Event = field(default_factory=threading.Event, init=False)
    _server: ThreadingHTTPServer | None = field(default=None, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)
    _url: str | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        """The base URL; still valid (and refusing connections) after `stop()`."""
        if self._url is None:
            raise RuntimeError("FakeGemini is not started")
        return self._url

    def reply(self, *replies: FakeReply) -> None:
        """Queue answers, served one per request in order."""
        with self._lock:
            self._script.extend(replies)

    def start(self) -> FakeGemini:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        host, port = self._server.server_address[:2]
        self._url = f"http://{host!s}:{port}"
        # A short poll interval: `shutdown()` waits up to one interval, once per test.
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.02,), name="fake-gemini", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Idempotent, so a test may stop the server early to simulate it being down."""
        self._closing.set()  # wakes handlers still sleeping in a delayed reply
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._thread = None

    def __enter__(self) -> FakeGemini:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _next(self, request: RecordedRequest) -> FakeReply:
        with self._lock:
            self.requests.append(request)
            return self._script.popleft() if self._script else self.default


def _handler_for(fake: FakeGemini) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            match = _PATH.match(self.path.split("?", 1)[0])
            length = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(length)
            if match is None:
                self._send(FakeReply.status(404, f"no route for {self.path}"))
                return
            body = json.loads(raw) if raw else {}
            recorded = RecordedRequest(self.path, match["model"], dict(self.headers), body)
            reply = fake._next(recorded)
            if reply.delay_seconds and fake._closing.wait(reply.delay_seconds):
                return
            self._send(reply)

        def _send(self, reply: FakeReply) -> None:
            payload = json.dumps(reply.body).encode()
            try:
                self.send_response(reply.http_status)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                # The client gave up (its timeout is what a delayed reply tests); nobody
                # is left to answer.
                self.close_connection = True

        def log_message(self, format: str, *args: Any) -> None:
            """Silent: pytest output should show the test's failures, not access logs."""

    return Handler


@pytest.fixture
def fake_gemini() -> Iterator[FakeGemini]:
    with FakeGemini() as fake:
        yield fake
