"""GeminiBackend through the real google-genai SDK, against the local fake Gemini server."""

from __future__ import annotations

import json
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

with warnings.catch_warnings():
    # google-genai 3.3.0's types.py has an invalid escape ("\/") in a docstring. Compiling it
    # (no cached .pyc, e.g. under PYTHONDONTWRITEBYTECODE) warns, and -W error turns that
    # warning into a SyntaxError at import. Importing the SDK once here, filtered, avoids it.
    warnings.filterwarnings("ignore", "invalid escape sequence", DeprecationWarning)
    warnings.filterwarnings("ignore", "invalid escape sequence", SyntaxWarning)
    from google import genai

from domain.model import FactType, MemoryState, SurfacePolicy, TokenUsage
from processors.errors import (
    BackendError,
    CredentialsRefused,
    TransientBackendError,
    UnusableAnswer,
)
from processors.llm.gemini import (
    DEFAULT_MAX_OUTPUT_TOKENS,
    DEFAULT_THINKING_BUDGET,
    MODEL_OUTPUT_LIMIT,
    GeminiBackend,
    make_gemini_client,
    parse_output,
)
from processors.prompt import PROMPT_VERSION, output_json_schema
from processors.schema import (
    MAX_FACT_CHARS,
    MAX_FACTS_PER_RUN,
    MAX_WORKING_MEMORY_CHARS,
    MAX_WORKING_MEMORY_WORDS,
    ConsolidationRequest,
    FactOp,
)
from producers.contract import ContextEvent, EventType, Source, SourceMetadata
from tests.support.fake_gemini import (  # noqa: F401
    FakeGemini,
    FakeReply,
    count_tokens,
    fake_gemini,
)

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)

GOOD: dict[str, Any] = {
    "updated_working_memory": "The user is redesigning Atlas and prefers dark mode.",
    "updated_scaffold": {"Role": "designer", "Projects": [{"name": "Atlas"}]},
    "facts": [
        {
            "op": "add",
            "content": "The user prefers dark mode.",
            "type": "preference",
            "confidence": 0.9,
            "salience": 0.6,
            "surface": "adapt",
            "target_fact_id": None,
            "evidence": ["E1"],
        }
    ],
}


def consolidation_request() -> ConsolidationRequest:
    event = ContextEvent(
        event_id=uuid.uuid4(),
        user_id="u1",
        organization_id="o1",
        event_type=EventType.PREFERENCE,
        content="I like dark mode in every app.",
        source_metadata=SourceMetadata(source=Source.INTERACTIVE),
        occurred_at=NOW,
    )
    state = MemoryState(user_id="u1", organization_id="o1", working_memory="Redesigning Atlas.")
    return ConsolidationRequest.build(state, (), [event], NOW)


@pytest.fixture
def client(fake_gemini: FakeGemini) -> Iterator[genai.Client]:  # noqa: F811
    with make_gemini_client("test-key", fake_gemini.url, timeout_ms=5_000) as c:
        yield c


@pytest.fixture
def backend(client: genai.Client) -> GeminiBackend:
    return GeminiBackend(client)


def test_good_response_is_validated_with_usage(
    fake_gemini: FakeGemini,  # noqa: F811
    backend: GeminiBackend,
) -> None:
    fake_gemini.reply(
        FakeReply.json(GOOD, prompt_tokens=120, completion_tokens=30, thoughts_tokens=15)
    )
    response = backend.consolidate(consolidation_request())
    assert response.output.updated_working_memory == GOOD["updated_working_memory"]
    assert response.output.updated_scaffold == GOOD["updated_scaffold"]
    [fact] = response.output.facts
    assert (fact.op, fact.type, fact.surface) == (
        FactOp.ADD,
        FactType.PREFERENCE,
        SurfacePolicy.ADAPT,
    )
    assert fact.evidence == ["E1"]
    # Thinking tokens are billed as output.
    assert response.usage == TokenUsage(prompt_tokens=120, completion_tokens=45)
    assert response.model == "gemini-2.5-flash"
    assert json.loads(response.raw_response) == GOOD
    assert (backend.name, backend.prompt_version) == ("gemini", PROMPT_VERSION)


def test_the_model_s_thinking_is_given_a_budget_on_top_of_the_answer_s_room(
    fake_gemini: FakeGemini,  # noqa: F811
    client: genai.Client,
) -> None:
    fake_gemini.reply(FakeReply.json(GOOD), FakeReply.json(GOOD))
    GeminiBackend(client).consolidate(consolidation_request())
    GeminiBackend(client, thinking_budget=None).consolidate(consolidation_request())
    budgeted, unset = (r.generation_config for r in fake_gemini.requests)
    # The SDK passes the config's field through as named (proto JSON reads either casing).
    assert budgeted["thinkingConfig"] in ({"thinkingBudget": 2048}, {"thinking_budget": 2048})
    # Thinking cannot eat the answer's room: the request's cap is the room plus the budget.
    assert budgeted["maxOutputTokens"] == DEFAULT_MAX_OUTPUT_TOKENS + 2048
    assert unset["maxOutputTokens"] == DEFAULT_MAX_OUTPUT_TOKENS
    assert "thinkingConfig" not in unset


def test_an_output_cap_beyond_what_a_model_answers_is_refused(client: genai.Client) -> None:
    GeminiBackend(client, max_output_tokens=MODEL_OUTPUT_LIMIT, thinking_budget=None)
    with pytest.raises(ValueError, match="65536"):
        GeminiBackend(client, max_output_tokens=MODEL_OUTPUT_LIMIT, thinking_budget=1)


def test_an_answer_beyond_its_room_is_cut_at_max_tokens_and_unusable(
    fake_gemini: FakeGemini,  # noqa: F811
    client: genai.Client,
) -> None:
    long = {**GOOD, "updated_working_memory": "日本語のメモ。" * 60}
    fake_gemini.reply(FakeReply.json(long, thoughts_tokens=40), FakeReply.json(long))
    with pytest.raises(UnusableAnswer, match="MAX_TOKENS") as raised:
        GeminiBackend(client, max_output_tokens=300, thinking_budget=40).consolidate(
            consolidation_request()
        )
    # The answer had its 300 tokens, the thinking its 40, and both were billed.
    assert raised.value.usage.completion_tokens == 340
    # With room for it, the same answer is whole.
    output = GeminiBackend(client, max_output_tokens=600).consolidate(consolidation_request())
    assert output.output.updated_working_memory == long["updated_working_memory"]


def test_what_the_context_cache_served_is_counted_apart(
    fake_gemini: FakeGemini,  # noqa: F811
    backend: GeminiBackend,
) -> None:
    reply = FakeReply.json(GOOD, prompt_tokens=1200, completion_tokens=30)
    reply.body["usageMetadata"]["cachedContentTokenCount"] = 1024
    fake_gemini.reply(reply)
    usage = backend.consolidate(consolidation_request()).usage
    assert usage == TokenUsage(prompt_tokens=1200, completion_tokens=30, cached_prompt_tokens=1024)


def test_request_is_deterministic_json_with_schema(
    fake_gemini: FakeGemini,  # noqa: F811
    client: genai.Client,
) -> None:
    fake_gemini.reply(FakeReply.json(GOOD))
    GeminiBackend(client, model="gemini-2.5-pro", max_output_tokens=2048).consolidate(
        consolidation_request()
    )
    [sent] = fake_gemini.requests
    assert sent.model == "gemini-2.5-pro"
    config = sent.generation_config
    assert config["temperature"] == 0
    assert config["responseMimeType"] == "application/json"
    assert config["responseJsonSchema"] == output_json_schema()
    assert "responseSchema" not in config
    assert config["maxOutputTokens"] == 2048 + DEFAULT_THINKING_BUDGET
    assert "updated_working_memory" in sent.system_text
    assert '<observation label="E1" type="preference"' in sent.user_text
    assert sent.headers.get("x-goog-api-key") == "test-key"


@pytest.mark.parametrize(
    ("reply", "transient", "failure"),
    [
        pytest.param(
            FakeReply.status(429, "Resource has been exhausted"), True, "rate_limited", id="429"
        ),
        pytest.param(FakeReply.status(408), True, "timeout", id="408"),
        pytest.param(FakeReply.status(500), True, "server_error", id="500"),
        pytest.param(
            FakeReply.status(503, "The model is overloaded"), True, "server_error", id="503"
        ),
        pytest.param(FakeReply.status(504), True, "timeout", id="504"),
        pytest.param(FakeReply.status(501, "Method not implemented"), False, "refused", id="501"),
        pytest.param(FakeReply.status(400, "Invalid JSON payload"), False, "refused", id="400"),
        pytest.param(FakeReply.status(404, "models/x is not found"), False, "refused", id="404"),
    ],
)
def test_http_errors_are_mapped_without_sdk_retries(
    fake_gemini: FakeGemini,  # noqa: F811
    backend: GeminiBackend,
    reply: FakeReply,
    transient: bool,
    failure: str,
) -> None:
    fake_gemini.reply(reply)
    with pytest.raises(BackendError) as raised:
        backend.consolidate(consolidation_request())
    assert isinstance(raised.value, TransientBackendError) is transient
    assert raised.value.failure == failure  # the dead letters' `cause` label
    assert str(reply.http_status) in str(raised.value)
    # One request: retrying is the consumer's job, per user, with backoff.
    assert len(fake_gemini.requests) == 1


KEY_INVALID = "API key expired. Please renew the API key."


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(FakeReply.status(401, "Request had invalid credentials"), id="401"),
        pytest.param(FakeReply.status(403, "Method doesn't allow unregistered callers"), id="403"),
        pytest.param(
            FakeReply.status(
                403,
                "Generative Language API has not been used in project 1",
                reason="SERVICE_DISABLED",
            ),
            id="API disabled",
        ),
        pytest.param(FakeReply.status(400, KEY_INVALID, reason="API_KEY_INVALID"), id="key"),
    ],
)
def test_a_refused_key_or_project_is_credentials_refused(
    fake_gemini: FakeGemini,  # noqa: F811
    backend: GeminiBackend,
    reply: FakeReply,
) -> None:
    # Every request fails alike until the key is fixed: not a batch to dead-letter.
    fake_gemini.reply(reply)
    with pytest.raises(CredentialsRefused) as raised:
        backend.consolidate(consolidation_request())
    assert str(reply.http_status) in str(raised.value)
    assert raised.value.usage == TokenUsage()
    assert len(fake_gemini.requests) == 1


def test_a_request_refused_for_another_reason_stays_permanent(
    fake_gemini: FakeGemini,  # noqa: F811
    backend: GeminiBackend,
) -> None:
    # A 400 whose ErrorInfo names something else is about the request, not the key.
    fake_gemini.reply(FakeReply.status(400, "Invalid value", reason="BAD_REQUEST"))
    with pytest.raises(BackendError) as raised:
        backend.consolidate(consolidation_request())
    assert not isinstance(raised.value, TransientBackendError)


@pytest.mark.parametrize(
    ("reply", "asked"),
    [
        pytest.param(FakeReply.status(429, retry_delay="37s"), 37.0, id="quota RetryInfo"),
        pytest.param(FakeReply.status(429, retry_delay="1.250s"), 1.25, id="fractional"),
        pytest.param(FakeReply.status(503, retry_after="20"), 20.0, id="Retry-After"),
        pytest.param(
            FakeReply.status(429, retry_delay="5s", retry_after="60"), 5.0, id="RetryInfo first"
        ),
        pytest.param(FakeReply.status(429, retry_delay="soon"), None, id="unreadable"),
        pytest.param(FakeReply.status(500), None, id="none named"),
    ],
)
def test_the_retry_delay_the_api_asks_for_goes_with_the_error(
    fake_gemini: FakeGemini,  # noqa: F811
    backend: GeminiBackend,
    reply: FakeReply,
    asked: float | None,
) -> None:
    fake_gemini.reply(reply)
    with pytest.raises(TransientBackendError) as raised:
        backend.consolidate(consolidation_request())
    assert raised.value.retry_after_s == asked


def test_an_answer_cut_short_on_its_way_is_transient(
    fake_gemini: FakeGemini,  # noqa: F811
    backend: GeminiBackend,
) -> None:
    # A 200 whose body is not JSON says nothing about the batch: a proxy or a connection cut
    # it. Dead-lettering the batch on it would lose good events to a network glitch.
    fake_gemini.reply(FakeReply.not_json())
    with pytest.raises(TransientBackendError, match="not JSON"):
        backend.consolidate(consolidation_request())
    assert len(fake_gemini.requests) == 1


@pytest.mark.parametrize("http_client", ["httpx2", "httpx"])
def test_timeout_is_transient(
    fake_gemini: FakeGemini,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    http_client: str,
) -> None:
    # The SDK uses httpx2 unless told otherwise; the two raise unrelated ReadTimeout classes.
    monkeypatch.setenv("GOOGLE_GENAI_HTTP_CLIENT", http_client)
    fake_gemini.reply(FakeReply.delay(5.0, then=FakeReply.json(GOOD)))
    with (
        make_gemini_client("test-key", fake_gemini.url, timeout_ms=300) as client,
        pytest.raises(TransientBackendError, match="Timeout") as raised,
    ):
        GeminiBackend(client).consolidate(consolidation_request())
    cause = type(raised.value.__cause__)
    assert (cause.__module__, cause.__name__) == (http_client, "ReadTimeout")
    assert raised.value.failure == "timeout"
    assert len(fake_gemini.requests) == 1


def test_connection_refused_is_transient(fake_gemini: FakeGemini) -> None:  # noqa: F811
    url = fake_gemini.url
    fake_gemini.stop()
    with (
        make_gemini_client("test-key", url, timeout_ms=1_000) as client,
        pytest.raises(TransientBackendError, match="ConnectError") as raised,
    ):
        GeminiBackend(client).consolidate(consolidation_request())
    assert raised.value.failure == "unreachable"


def test_truncated_json_fails_with_raw_response(
    fake_gemini: FakeGemini,  # noqa: F811
    backend: GeminiBackend,
) -> None:
    truncated = json.dumps(GOOD)[:60]
    fake_gemini.reply(FakeReply.text(truncated, finish_reason="MAX_TOKENS"))
    with pytest.raises(BackendError, match="MAX_TOKENS") as raised:
        backend.consolidate(consolidation_request())
    assert not isinstance(raised.value, TransientBackendError)
    assert raised.value.raw_response == truncated


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        pytest.param(FakeReply.blocked("PROHIBITED_CONTENT"), "PROHIBITED_CONTENT", id="blocked"),
        pytest.param(FakeReply.no_candidates(), "no candidates", id="no-candidates"),
        pytest.param(FakeReply.no_text("MAX_TOKENS"), "MAX_TOKENS", id="thinking-ate-budget"),
        pytest.param(FakeReply.text("", finish_reason="SAFETY"), "SAFETY", id="safety-empty"),
        pytest.param(FakeReply.text("I cannot", finish_reason="SAFETY"), "SAFETY", id="safety"),
        pytest.param(FakeReply.text("[1, 2]"), "not an object", id="array"),
        pytest.param(FakeReply.json({"facts": []}), "updated_working_memory", id="missing-w"),
    ],
)
def test_unusable_answers_fail_never_empty(
    fake_gemini: FakeGemini,  # noqa: F811
    backend: GeminiBackend,
    reply: FakeReply,
    message: str,
) -> None:
    fake_gemini.reply(reply)
    with pytest.raises(UnusableAnswer, match=message) as raised:
        backend.consolidate(consolidation_request())
    # The run record keeps what came back, even when it holds no text, and what it cost.
    assert raised.value.raw_response
    meta = reply.body["usageMetadata"]
    thoughts = meta.get("thoughtsTokenCount", 0)
    assert raised.value.usage == TokenUsage(
        meta["promptTokenCount"], meta.get("candidatesTokenCount", 0) + thoughts
    )
    assert raised.value.usage.total > 0


def test_a_truncated_answer_carries_its_usage(
    fake_gemini: FakeGemini,  # noqa: F811
    backend: GeminiBackend,
) -> None:
    fake_gemini.reply(FakeReply.text("{", "MAX_TOKENS", 321, 8000, thoughts_tokens=192))
    with pytest.raises(UnusableAnswer) as raised:
        backend.consolidate(consolidation_request())
    assert raised.value.usage == TokenUsage(prompt_tokens=321, completion_tokens=8192)


def test_an_answer_cut_into_parts_is_one_request_and_unusable(
    fake_gemini: FakeGemini,  # noqa: F811
    backend: GeminiBackend,
) -> None:
    text = json.dumps(GOOD)
    fake_gemini.reply(FakeReply.continued(text[:40]), FakeReply.text(text[40:]))
    with pytest.raises(UnusableAnswer) as raised:
        backend.consolidate(consolidation_request())
    assert "CONTINUATION" in str(raised.value)
    assert raised.value.usage == TokenUsage(prompt_tokens=100, completion_tokens=50)
    assert len(fake_gemini.requests) == 1
    assert fake_gemini.requests[0].generation_config.get("automaticContinuation") is None


@pytest.mark.parametrize("code", [400, 404])
def test_api_errors_are_not_unusable_answers(
    fake_gemini: FakeGemini,  # noqa: F811
    backend: GeminiBackend,
    code: int,
) -> None:
    """A refused request is not about one event of the batch: no bisecting, nothing billed."""
    fake_gemini.reply(FakeReply.status(code))
    with pytest.raises(BackendError) as raised:
        backend.consolidate(consolidation_request())
    assert not isinstance(raised.value, UnusableAnswer | TransientBackendError)
    assert raised.value.usage == TokenUsage()


def test_the_fake_counts_the_prompt_it_answers(
    fake_gemini: FakeGemini,  # noqa: F811
    backend: GeminiBackend,
) -> None:
    fake_gemini.reply(FakeReply.json(GOOD, prompt_tokens=None), FakeReply.json(GOOD, None))
    short = backend.consolidate(consolidation_request())
    request = consolidation_request()
    longer = replace(request, state=replace(request.state, working_memory="word " * 1_000))
    long = backend.consolidate(longer)
    first, second = fake_gemini.requests
    assert short.usage.prompt_tokens == count_tokens(first.system_text) + count_tokens(
        first.user_text
    )
    grown = count_tokens("word " * 1_000) - count_tokens(request.state.working_memory)
    assert long.usage.prompt_tokens - short.usage.prompt_tokens == grown
    assert second.observations == [("E1", "I like dark mode in every app.")]


@pytest.mark.parametrize(
    "text",
    [
        # Within the answer's room (the fake cuts what is not), far past the decoder's depth.
        pytest.param("[" * 20_000, id="absurd-nesting"),
        pytest.param("9" * 10_000, id="integer-too-long"),
    ],
)
def test_answers_python_cannot_decode_fail_permanently_with_their_usage(
    fake_gemini: FakeGemini,  # noqa: F811
    backend: GeminiBackend,
    text: str,
) -> None:
    # json.loads raises ValueError or RecursionError here, not JSONDecodeError: were the SDK
    # to decode the answer for `.parsed`, the paid call would be booked as zero tokens.
    fake_gemini.reply(FakeReply.text(text, prompt_tokens=120, completion_tokens=8000))
    with pytest.raises(UnusableAnswer, match="output is not JSON") as raised:
        backend.consolidate(consolidation_request())
    assert raised.value.usage == TokenUsage(prompt_tokens=120, completion_tokens=8000)
    assert raised.value.raw_response == text


def test_fenced_json_is_accepted(
    fake_gemini: FakeGemini,  # noqa: F811
    backend: GeminiBackend,
) -> None:
    fenced = f"```json\n{json.dumps(GOOD, indent=2)}\n```"
    fake_gemini.reply(FakeReply.text(fenced))
    response = backend.consolidate(consolidation_request())
    assert response.output.updated_scaffold == GOOD["updated_scaffold"]
    assert response.raw_response == fenced


def test_nested_json_strings_are_normalized(
    fake_gemini: FakeGemini,  # noqa: F811
    backend: GeminiBackend,
) -> None:
    stringified = {
        "updated_working_memory": "Designer at Acme.",
        "updated_scaffold": json.dumps({"Role": "designer", "Projects": json.dumps(["Atlas"])}),
        "facts": [json.dumps(GOOD["facts"][0]), GOOD["facts"][0]],
    }
    fake_gemini.reply(FakeReply.json(stringified))
    output = backend.consolidate(consolidation_request()).output
    assert output.updated_scaffold == {"Role": "designer", "Projects": ["Atlas"]}
    assert [f.content for f in output.facts] == ["The user prefers dark mode."] * 2


def test_oversized_working_memory_is_capped_not_failed(
    fake_gemini: FakeGemini,  # noqa: F811
    backend: GeminiBackend,
) -> None:
    long_w = " ".join(f"word{i}" for i in range(2_000))
    fake_gemini.reply(FakeReply.json({**GOOD, "updated_working_memory": long_w}))
    output = backend.consolidate(consolidation_request()).output
    capped = output.updated_working_memory
    assert len(capped.split()) == MAX_WORKING_MEMORY_WORDS
    assert len(capped) <= MAX_WORKING_MEMORY_CHARS
    assert long_w.startswith(capped)
    assert capped.endswith(f"word{MAX_WORKING_MEMORY_WORDS - 1}")


def test_other_length_caps_trim_instead_of_failing(
    fake_gemini: FakeGemini,  # noqa: F811
    backend: GeminiBackend,
) -> None:
    long_fact = {**GOOD["facts"][0], "content": "word " * 200, "evidence": ["E1"] * 25}
    fake_gemini.reply(FakeReply.json({**GOOD, "facts": [long_fact] * (MAX_FACTS_PER_RUN + 5)}))
    output = backend.consolidate(consolidation_request()).output
    assert len(output.facts) == MAX_FACTS_PER_RUN
    assert all(len(f.content) <= MAX_FACT_CHARS for f in output.facts)
    assert all(len(f.evidence) == 20 for f in output.facts)


@pytest.mark.parametrize("text", ["[" * 100_000, "9" * 10_000, "{", ""])
def test_parse_output_raises_backend_error_with_raw(text: str) -> None:
    with pytest.raises(BackendError, match="not JSON") as raised:
        parse_output(text, finish_reason="MAX_TOKENS")
    assert raised.value.raw_response == text
    assert "MAX_TOKENS" in str(raised.value)


def test_parse_output_makes_what_postgres_refuses_storable() -> None:
    # Each of these is valid to Python's parser and failed the run's write in Postgres.
    answer = (
        '{"updated_working_memory": "Ada\\u0000 likes tea",'
        ' "updated_scaffold": {"Pet": "\\ud800", "Score": NaN, "Big": 1e999},'
        ' "facts": [{"content": "Ada likes tea\\u0000", "type": "preference"}]}'
    )
    output = parse_output(answer)
    assert output.updated_working_memory == "Ada\ufffd likes tea"
    assert output.updated_scaffold == {"Pet": "\ufffd", "Score": None, "Big": None}
    assert output.facts[0].content == "Ada likes tea\ufffd"


def test_an_op_without_its_target_does_not_refuse_the_answer() -> None:
    # One proposal off the schema's spirit (an update naming no fact) must not cost the whole
    # answer, and a bisection of the batch with it: the ledger reads it as an add.
    answer = {
        **GOOD,
        "facts": [
            *GOOD["facts"],
            {**GOOD["facts"][0], "op": "update", "content": "The user leads Atlas."},
        ],
    }
    output = parse_output(json.dumps(answer))
    assert [(p.op, p.target_fact_id) for p in output.facts] == [
        (FactOp.ADD, None),
        (FactOp.UPDATE, None),
    ]


def test_scores_out_of_their_range_are_clamped_not_failed() -> None:
    # 1.2, or a percentage: the model's meaning is clear enough, and refusing the answer would
    # cost the batch its retries and then a dead letter.
    scores = [(1.2, -0.1), (85, 7), (0.4, 0.5), (True, 0.5)]
    facts = [{**GOOD["facts"][0], "confidence": c, "salience": s} for c, s in scores]
    output = parse_output(json.dumps({**GOOD, "facts": facts}))
    assert [(f.confidence, f.salience) for f in output.facts] == [
        (1.0, 0.0),
        (1.0, 1.0),
        (0.4, 0.5),
        (1.0, 0.5),  # a JSON true is read as 1, as the schema's validator reads it
    ]


@pytest.mark.parametrize(("given", "read"), [("skill", "profile"), ("Preference", "preference")])
def test_a_fact_type_off_the_list_is_read_as_the_generic_profile(given: str, read: str) -> None:
    output = parse_output(json.dumps({**GOOD, "facts": [{**GOOD["facts"][0], "type": given}]}))
    assert output.facts[0].type == FactType(read)


@pytest.mark.parametrize(("field", "value"), [("op", "delete"), ("surface", "whisper")])
def test_an_op_or_surface_off_the_list_still_refuses_the_answer(field: str, value: str) -> None:
    # Read as an add, a "delete" would store what the model meant to remove; read as "speak",
    # a fact meant to be avoided would be said.
    answer = {**GOOD, "facts": [{**GOOD["facts"][0], field: value}]}
    with pytest.raises(UnusableAnswer, match="schema"):
        parse_output(json.dumps(answer))


def test_seed_shape_is_accepted(
    fake_gemini: FakeGemini,  # noqa: F811
    backend: GeminiBackend,
) -> None:
    seed = {
        "updated_working_memory": "Designer at Acme.",
        "updated_scaffold": {"Role": "designer"},
        "facts_to_embed": ["The user prefers dark mode.", "The user works at Acme."],
    }
    fake_gemini.reply(FakeReply.json(seed))
    output = backend.consolidate(consolidation_request()).output
    assert output.facts == []
    assert [p.content for p in output.all_proposals()] == seed["facts_to_embed"]
    assert all(p.op is FactOp.ADD for p in output.all_proposals())


def test_default_reply_when_script_is_empty(
    fake_gemini: FakeGemini,  # noqa: F811
    backend: GeminiBackend,
) -> None:
    fake_gemini.default = FakeReply.json(GOOD)
    for _ in range(2):
        backend.consolidate(consolidation_request())
    assert len(fake_gemini.requests) == 2
