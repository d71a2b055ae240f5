"""A shadow replay by the real google-genai SDK, against the local fake Gemini server, meeting
a transient failure or a refused key: it waits what the provider asked, up to the processor's
cap and within its attempts, as a live flush of one memory does; a refused key stops it."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest

with warnings.catch_warnings():
    # See tests/unit/test_gemini_backend.py: the SDK's types.py warns when compiled.
    warnings.filterwarnings("ignore", "invalid escape sequence", DeprecationWarning)
    warnings.filterwarnings("ignore", "invalid escape sequence", SyntaxWarning)
    from processors.llm.gemini import GeminiBackend

from consumers.replay import batches_by_size, shadow_consolidate
from consumers.replay_result import ReplayStopped, ShadowResult
from domain.model import RunStatus, TokenUsage
from processors.consolidate import Consolidator
from processors.cost import ModelPrice, PriceTable
from processors.gate import WriteGate
from producers.contract import ContextEvent
from tests.support.builders import key_of, make_event
from tests.support.deployment import gemini_backend
from tests.support.fake_gemini import FakeGemini, FakeReply
from tests.support.fakes import BagOfWordsEmbedder

ADA = key_of("ada")
ANSWER = {"updated_working_memory": "The user reads.", "updated_scaffold": {}, "facts": []}
USAGE = TokenUsage(prompt_tokens=100, completion_tokens=50)


@pytest.fixture
def fake() -> Iterator[FakeGemini]:
    with FakeGemini(default=FakeReply.json(ANSWER)) as server:
        yield server


@pytest.fixture
def backend(fake: FakeGemini) -> Iterator[GeminiBackend]:
    with gemini_backend(fake.url) as b:
        yield b


def consolidator() -> Consolidator:
    price = ModelPrice(input_usd_per_mtok=1.0, output_usd_per_mtok=10.0)
    return Consolidator(WriteGate(BagOfWordsEmbedder()), PriceTable({}, default=price))


def notes(n: int) -> list[ContextEvent]:
    return [make_event("ada", f"I read chapter {i}", minutes=i) for i in range(n)]


def rate_limited(delay: str) -> FakeReply:
    return FakeReply.status(429, "Resource has been exhausted", retry_delay=delay)


def replay(
    backend: GeminiBackend, events: list[ContextEvent], slept: list[float], max_batch: int = 8
) -> ShadowResult:
    """With the processor's default settings: 4 attempts, backoff from 0.5 s, the provider's
    delay honoured up to 120 s. `slept` gets the waits, not waited."""
    batches = batches_by_size(events, max_batch)
    return shadow_consolidate(ADA, batches, backend, consolidator(), sleep=slept.append)


@pytest.mark.parametrize(
    ("failures", "waits", "answered"),
    [
        # Longer than the backoff's first waits (0.5 s, 1 s, 2 s, each ± 20 %): the quota's.
        pytest.param([rate_limited("3s")] * 2, [3.0, 3.0], True, id="retryDelay"),
        pytest.param([FakeReply.status(503, retry_after="4")], [4.0], True, id="503-retry-after"),
        # An absurd delay is honoured only up to the processor's backend_retry_max_s.
        pytest.param([rate_limited("86400s")], [120.0], True, id="capped"),
        # Given up on after the processor's max_attempts, as a live flush would be.
        pytest.param([rate_limited("3s")] * 4, [3.0, 3.0, 3.0], False, id="out-of-attempts"),
    ],
)
def test_a_transient_failure_is_retried_after_the_wait_the_provider_asked_for(
    fake: FakeGemini,
    backend: GeminiBackend,
    failures: list[FakeReply],
    waits: list[float],
    answered: bool,
) -> None:
    fake.reply(*failures)
    slept: list[float] = []
    events = notes(3)
    result = replay(backend, events, slept)

    assert slept == waits
    assert len(fake.requests) == len(failures) + answered
    if answered:
        assert [r.attempt for r in result.runs] == [len(failures)]
        assert result.failed == ()
        assert result.memory.version == 1
    else:
        assert result.runs == ()
        [failed] = result.failed
        assert failed.event_ids == tuple(e.event_id for e in events)
        assert "429" in failed.error
    # Every call is counted; the failures used no tokens, the answer its own.
    assert [r.status for r in result.unapplied] == [RunStatus.FAILED] * len(failures)
    assert result.prompt_tokens == (USAGE.prompt_tokens if answered else 0)


@pytest.mark.parametrize(
    "refusal",
    [
        pytest.param(FakeReply.status(400, "API key expired.", reason="API_KEY_INVALID"), id="key"),
        pytest.param(FakeReply.status(403, "Permission denied on the project"), id="403"),
    ],
)
def test_a_refused_key_stops_the_replay_at_once_with_what_it_paid_for(
    fake: FakeGemini, backend: GeminiBackend, refusal: FakeReply
) -> None:
    # The first batch is answered, the second refused: a third is never asked.
    fake.reply(FakeReply.json(ANSWER), refusal)
    slept: list[float] = []

    with pytest.raises(ReplayStopped) as stopped:
        replay(backend, notes(6), slept, max_batch=2)

    assert len(fake.requests) == 2
    assert slept == []
    assert str(refusal.http_status) in str(stopped.value)
    made = stopped.value.partial
    assert [len(r.input_event_ids) for r in made.runs] == [2]
    assert made.failed == ()
    assert [r.status for r in made.unapplied] == [RunStatus.FAILED]
    assert made.prompt_tokens == USAGE.prompt_tokens
    assert made.cost_micro_usd == made.runs[0].cost_micro_usd > 0
