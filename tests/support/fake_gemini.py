"""A local fake of the Gemini API's `generateContent`, for the real google-genai SDK.

Point a client at it with `HttpOptions(base_url=fake.url, api_version="v1beta")`. It answers
from a script of `FakeReply`s, then from `responder` (a function of the request) if set, then
from a default reply, with bodies shaped like the real API's, and records every request so
tests can assert what the SDK sent.

Like the real API it reports usage with every answer the model gave, usable or not (the SDK
hands it over even when `parsed` is None). A reply made with `prompt_tokens=None` counts the
prompt it answers (`count_tokens`), so benches see the prompt's real size.

Like the real API it holds an answer to the request's `maxOutputTokens`, thinking included:
a text longer than the room left by the reply's thinking is cut there, with finish reason
MAX_TOKENS (`output_tokens` estimates a text's tokens).
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from html import unescape
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

import pytest

_PATH = re.compile(r"^/v1beta/models/(?P<model>[^/:]+):generateContent$")
# Words, numbers and single punctuation marks: roughly how a subword tokenizer splits prose
# and markup, deterministic, and with no vocabulary to download.
_TOKEN = re.compile(r"\w+|[^\w\s]")


def count_tokens(text: str) -> int:
    """An approximate token count of `text` (see `_TOKEN`)."""
    return len(_TOKEN.findall(text))


def output_tokens(text: str) -> int:
    """An estimate of the tokens a model spends writing `text`: about four characters a token
    for ASCII, one a character for the rest (a CJK character is a token or more)."""
    wide = sum(1 for c in text if not c.isascii())
    return wide + -(-(len(text) - wide) // 4)


def _cut_to_tokens(text: str, tokens: int) -> str:
    """The longest start of `text` whose `output_tokens` is at most `tokens`."""
    spent, chars = 0.0, 0
    for c in text:
        spent += 0.25 if c.isascii() else 1.0
        if spent > tokens:
            break
        chars += 1
    return text[:chars]


def _within_output_cap(body: dict[str, Any], request: RecordedRequest) -> dict[str, Any]:
    cap = request.generation_config.get("maxOutputTokens")
    candidates = body.get("candidates") or []
    if cap is None or len(candidates) != 1:
        return body
    parts = candidates[0].get("content", {}).get("parts", [])
    text = "".join(p.get("text", "") for p in parts)
    usage = body.get("usageMetadata", {})
    room = max(cap - usage.get("thoughtsTokenCount", 0), 0)
    if output_tokens(text) <= room:
        return body
    cut = {"parts": [{"text": _cut_to_tokens(text, room)}], "role": "model"}
    candidate = {**candidates[0], "content": cut, "finishReason": "MAX_TOKENS"}
    spent = usage.get("totalTokenCount", 0) - usage.get("candidatesTokenCount", 0) + room
    capped = {**usage, "candidatesTokenCount": room, "totalTokenCount": spent}
    return {**body, "candidates": [candidate], "usageMetadata": capped}


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
    raw_body: bytes | None = None  # sent instead of `body` (an answer that is not JSON)
    headers: tuple[tuple[str, str], ...] = ()  # sent besides Content-Type and -Length

    @classmethod
    def text(
        cls,
        raw_text: str,
        finish_reason: str = "STOP",
        prompt_tokens: int | None = 100,
        completion_tokens: int = 50,
        thoughts_tokens: int | None = None,
        model_version: str = "gemini-2.5-flash",
    ) -> FakeReply:
        """A candidate whose only part is `raw_text`, as the model wrote it.

        `prompt_tokens=None`: counted from the request when it is answered.
        """
        prompt = _COUNT_PROMPT if prompt_tokens is None else prompt_tokens
        usage: dict[str, Any] = {
            "promptTokenCount": prompt,
            "candidatesTokenCount": completion_tokens,
            "totalTokenCount": prompt + completion_tokens + (thoughts_tokens or 0),
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}],
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
    def continued(cls, raw_text: str, token: bytes = b"hop-1") -> FakeReply:
        """The first part of an answer the model cut into several (finish reason
        CONTINUATION, with the token a next request would resume from)."""
        reply = cls.text(raw_text, "CONTINUATION")
        reply.body["candidates"][0]["continuationToken"] = base64.b64encode(token).decode()
        return reply

    @classmethod
    def json(
        cls,
        payload: Any,
        prompt_tokens: int | None = 100,
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
    def not_json(cls, raw: bytes = b'{"candidates": [{"content": {"par') -> FakeReply:
        """A 200 whose body is not JSON: cut short on its way, say."""
        return cls(200, {}, raw_body=raw)

    @classmethod
    def status(
        cls,
        code: int,
        message: str | None = None,
        retry_delay: str | None = None,
        retry_after: str | None = None,
        reason: str | None = None,
    ) -> FakeReply:
        """An error answer with the real API's `{"error": {code, message, status}}` body;
        `retry_delay` adds the google.rpc.RetryInfo a quota's 429 carries ("37s"),
        `retry_after` a Retry-After header, `reason` a google.rpc.ErrorInfo (the API's
        "API_KEY_INVALID" on a 400 for a revoked or expired key)."""
        text = message or HTTPStatus(code).phrase
        error: dict[str, Any] = {
            "code": code,
            "message": text,
            "status": _RPC_STATUS.get(code, "UNKNOWN"),
        }
        details: list[dict[str, Any]] = []
        if reason is not None:
            info = {"reason": reason, "domain": "googleapis.com"}
            details.append({"@type": "type.googleapis.com/google.rpc.ErrorInfo", **info})
        if retry_delay is not None:
            info = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": retry_delay}
            details.append(info)
        if details:
            error["details"] = details
        headers = () if retry_after is None else (("Retry-After", retry_after),)
        return cls(code, {"error": error}, headers=headers)

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


# Stands for "count the prompt" in a reply's usage until the request is known. Negative, so it
# can never be mistaken for a real count.
_COUNT_PROMPT = -1


def _with_prompt_counted(body: dict[str, Any], request: RecordedRequest) -> dict[str, Any]:
    usage = body.get("usageMetadata")
    if not usage or usage.get("promptTokenCount") != _COUNT_PROMPT:
        return body
    prompt = count_tokens(request.system_text) + count_tokens(request.user_text)
    total = usage["totalTokenCount"] - _COUNT_PROMPT + prompt
    details = [{"modality": "TEXT", "tokenCount": prompt}]
    counted = {**usage, "promptTokenCount": prompt, "totalTokenCount": total}
    return {**body, "usageMetadata": {**counted, "promptTokensDetails": details}}


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
    at: float = field(default_factory=time.monotonic)  # when it arrived

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

    @property
    def observations(self) -> list[tuple[str, str]]:
        """(label, text) of every observation in the prompt, as memoryd's prompt renders them."""
        return [(label, unescape(text)) for label, text in _OBSERVATION.findall(self.user_text)]

    @property
    def facts(self) -> list[tuple[str, str]]:
        """(id, text) of every existing fact the prompt shows."""
        return [(fact_id, unescape(text)) for fact_id, text in _FACT.findall(self.user_text)]


_OBSERVATION = re.compile(r'<observation label="([^"]+)"[^>]*>(.*?)</observation>', re.DOTALL)
_FACT = re.compile(r'<fact id="([^"]+)"[^>]*>(.*?)</fact>', re.DOTALL)


@dataclass
class FakeGemini:
    """The fake server; use as a context manager (or through the `fake_gemini` fixture)."""

    default: FakeReply = field(default_factory=lambda: FakeReply.status(500, "no reply scripted"))
    # Answers what the script does not, from the request (a stand-in model): see `reply_from`.
    responder: Callable[[RecordedRequest], FakeReply] | None = None
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
            if self._script:
                reply = self._script.popleft()
            elif self.responder is not None:
                reply = self.responder(request)
            else:
                reply = self.default
        body = _within_output_cap(_with_prompt_counted(reply.body, request), request)
        return replace(reply, body=body)


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
            payload = json.dumps(reply.body).encode() if reply.raw_body is None else reply.raw_body
            try:
                self.send_response(reply.http_status)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in reply.headers:
                    self.send_header(name, value)
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
