"""The real google-genai SDK against the local fake Gemini, through the real pipeline.

Kafka in, Postgres and Chroma out: what a good answer, rate limits, server errors, truncated
JSON, JSON-in-a-string and an oversized working memory each do to runs, memory, the dead-letter
topic and offsets. Retries are kept fast with a 50 ms backoff base and three attempts; the
provider's own retry delays are 1 s, so that honouring them shows against the backoff.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from memoryd import wiring
from memoryd.redrive import redrive
from producers.contract import EventType
from tests.support.builders import key_of, make_event
from tests.support.deployment import (
    Deployment,
    dead_letters,
    gemini_backend,
    headers_of,
    letter_count,
    tuned,
)
from tests.support.fake_gemini import FakeGemini, FakeReply, RecordedRequest

pytestmark = pytest.mark.integration

GOOD: dict[str, Any] = {
    "updated_working_memory": "Ada is an engineer at Initech who likes short answers.",
    "updated_scaffold": {"Role": "Engineer", "Employer": "Initech"},
    "facts": [
        {
            "op": "add",
            "content": "The user works in engineering at Initech.",
            "type": "profile",
            "confidence": 0.9,
            "salience": 0.7,
            "surface": "speak",
            "target_fact_id": None,
            "evidence": ["E1"],
        },
        {
            "op": "add",
            "content": "The user prefers short answers with code examples.",
            "type": "preference",
            "confidence": 0.85,
            "salience": 0.6,
            "surface": "adapt",
            "target_fact_id": None,
            "evidence": ["E2"],
        },
    ],
}


@pytest.fixture
def fake() -> Iterator[FakeGemini]:
    with FakeGemini() as server:
        yield server


@pytest.fixture
def fast(deployment: Deployment) -> Deployment:
    return tuned(deployment, backoff_base_s=0.05, max_attempts=3)


def publish_ada(deployment: Deployment) -> set[object]:
    events = [
        make_event("ada", "I work in engineering at Initech", minutes=0),
        make_event("ada", "I prefer short answers with code examples", EventType.PREFERENCE,
                   minutes=1),
    ]  # fmt: skip
    deployment.publish(events)
    return {e.event_id for e in events}


def run_gemini(deployment: Deployment, fake: FakeGemini) -> None:
    with gemini_backend(fake.url) as backend:
        deployment.run_processor(backend)


def runs(deployment: Deployment) -> list[tuple[Any, ...]]:
    return deployment.query(
        "SELECT status, input_event_ids, error, raw_response, prompt_tokens, completion_tokens"
        " FROM consolidation_runs ORDER BY seq"
    )


def consumed(deployment: Deployment) -> list[Any]:
    return [r[0] for r in deployment.query("SELECT event_id FROM consolidated_events")]


def dlq_size(deployment: Deployment) -> int:
    k = deployment.settings.kafka
    return letter_count(k.bootstrap_servers, k.dead_letter_topic)


def assert_both_dead_lettered(deployment: Deployment, *in_reason: str) -> None:
    """Both of ada's events are on the dead-letter topic from the consolidate stage, each
    with a reason that says all of in_reason."""
    k = deployment.settings.kafka
    letters = dead_letters(k.bootstrap_servers, k.dead_letter_topic, expected=2)
    assert len(letters) == 2
    for letter in letters:
        headers = headers_of(letter)
        assert headers["dlq.stage"] == "consolidate"
        for part in in_reason:
            assert part in headers["dlq.reason"]


def test_a_good_answer_becomes_memory(fast: Deployment, fake: FakeGemini) -> None:
    ids = publish_ada(fast)
    fake.reply(FakeReply.json(GOOD, prompt_tokens=120, completion_tokens=40))
    run_gemini(fast, fake)

    [sent] = fake.requests
    assert "<observation label=" in sent.user_text
    assert "I work in engineering at Initech" in sent.user_text
    [(status, inputs, error, _, prompt, completion)] = runs(fast)
    assert (status, set(inputs), error, prompt, completion) == ("succeeded", ids, None, 120, 40)
    assert sorted(consumed(fast), key=str) == sorted(ids, key=str)

    def check(c: wiring.Core) -> None:
        state = c.memory.load_state(key_of("ada"))
        assert state.working_memory == GOOD["updated_working_memory"]
        assert state.scaffold == GOOD["updated_scaffold"]
        facts = c.memory.facts(key_of("ada"))
        assert sorted(f.content for f in facts) == sorted(f["content"] for f in GOOD["facts"])
        assert all(f.indexed_at is not None for f in facts)
        assert c.index.count(key_of("ada")) == 2

    fast.with_core(check)
    assert dlq_size(fast) == 0


def test_rate_limited_twice_then_consolidated_once(fast: Deployment, fake: FakeGemini) -> None:
    ids = publish_ada(fast)
    fake.reply(
        FakeReply.status(429, "Resource has been exhausted"),
        FakeReply.status(429, "Resource has been exhausted"),
        FakeReply.json(GOOD),
    )
    run_gemini(fast, fake)

    assert len(fake.requests) == 3
    [(status, inputs, *_)] = runs(fast)
    assert (status, set(inputs)) == ("succeeded", ids)
    assert sorted(consumed(fast), key=str) == sorted(ids, key=str)
    assert fast.query("SELECT attempt FROM consolidation_runs") == [(2,)]
    assert dlq_size(fast) == 0


def test_server_errors_dead_letter_then_redrive_consolidates_once(
    fast: Deployment, fake: FakeGemini
) -> None:
    # One memory failing alone is never a backend outage (consumers.backend_outage): it
    # cannot be told from a batch the provider cannot serve, so it runs out of attempts.
    ids = publish_ada(fast)
    fake.default = FakeReply.status(500, "internal error")
    run_gemini(fast, fake)

    assert len(fake.requests) == 3  # max_attempts, each one request: no SDK retries
    assert_both_dead_lettered(fast, "gave up after 3 attempts", "500")
    [(status, inputs, error, *_)] = runs(fast)
    assert (status, set(inputs)) == ("failed", ids)
    assert "500" in error
    assert consumed(fast) == []

    fake.default = FakeReply.json(GOOD)
    assert redrive(fast.settings).redriven == 2
    run_gemini(fast, fake)
    assert [r[0] for r in runs(fast)] == ["failed", "succeeded"]
    assert set(runs(fast)[1][1]) == ids
    assert sorted(consumed(fast), key=str) == sorted(ids, key=str)

    # Nothing is redriven twice, and a second pass consolidates nothing again.
    assert redrive(fast.settings, idle_s=1.0).redriven == 0
    run_gemini(fast, fake)
    assert len(runs(fast)) == 2


def publish_users(deployment: Deployment, *users: str) -> dict[str, str]:
    """Two events per user; returns each user's first text, which names its requests."""
    firsts = {user: f"{user} works in engineering at Initech" for user in users}
    deployment.publish([
        event
        for user in users
        for event in (
            make_event(user, firsts[user], minutes=0),
            make_event(user, "I prefer short answers with code examples", EventType.PREFERENCE,
                       minutes=1),
        )
    ])  # fmt: skip
    return firsts


def times_of(fake: FakeGemini, text: str) -> list[float]:
    """When each request that carries `text` arrived."""
    return [r.at for r in fake.requests if text in r.user_text]


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


def run_counting_backend_outages(deployment: Deployment, fake: FakeGemini) -> float:
    """Run the processor on the fake; returns its outage retries of cause `backend`."""

    def run(c: wiring.Core) -> float:
        with gemini_backend(fake.url) as backend:
            deployment.processor(c, backend).run_until_idle(idle_s=2.0)
        labels = {"consumer": "processor", "cause": "backend"}
        return c.registry.get_sample_value("memoryd_outage_retries_total", labels) or 0.0

    result: float = deployment.with_core(run)
    return result


def retry_delays(caplog: pytest.LogCaptureFixture) -> list[float]:
    """The waits the processor computed for the flushes it retried, from its log."""
    return [r.retry_in_s for r in caplog.records if hasattr(r, "retry_in_s")]


def test_a_provider_rate_limiting_everyone_is_waited_out_as_it_asks(
    fast: Deployment, fake: FakeGemini, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    deployment = tuned(fast, backend_outage_after=2)
    firsts = publish_users(deployment, "ada", "bob")
    # A quota spent for a while: more 429s than the two memories' attempts together.
    quota = FakeReply.status(429, "Resource has been exhausted", retry_delay="1s")
    fake.reply(*[quota] * 8)
    fake.default = FakeReply.json(GOOD)

    backend_outage_retries = run_counting_backend_outages(deployment, fake)

    assert len(fake.requests) == 10
    assert [r[0] for r in runs(deployment)] == ["succeeded", "succeeded"]
    assert len(consumed(deployment)) == 4
    assert dlq_size(deployment) == 0
    assert backend_outage_retries >= 1
    # Every retry waited at least the second the API asked for, not the 50 ms backoff.
    delays = retry_delays(caplog)
    assert len(delays) == 8
    assert all(d >= 1.0 for d in delays), delays
    for text in firsts.values():
        assert all(gap >= 0.9 for gap in gaps(times_of(fake, text)))


def test_a_batch_failing_alone_while_others_are_answered_is_dead_lettered(
    fast: Deployment, fake: FakeGemini, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    deployment = tuned(fast, backend_outage_after=2)
    firsts = publish_users(deployment, "ada", "bob", "cy")
    overloaded = FakeReply.status(503, "The model is overloaded", retry_after="1")

    def answer(request: RecordedRequest) -> FakeReply:
        return overloaded if firsts["ada"] in request.user_text else FakeReply.json(GOOD)

    fake.responder = answer

    backend_outage_retries = run_counting_backend_outages(deployment, fake)

    assert_both_dead_lettered(deployment, "gave up after 3 attempts", "503")
    assert sorted(r[0] for r in runs(deployment)) == ["failed", "succeeded", "succeeded"]
    assert len(consumed(deployment)) == 4
    assert backend_outage_retries == 0
    ada = times_of(fake, firsts["ada"])
    assert len(ada) == 3
    assert all(gap >= 0.9 for gap in gaps(ada)), gaps(ada)
    assert retry_delays(caplog) == [1.0, 1.0]


def test_truncated_answers_are_bisected_and_every_call_is_booked(
    fast: Deployment, fake: FakeGemini
) -> None:
    ids = publish_ada(fast)
    truncated = json.dumps(GOOD)[:70]
    fake.default = FakeReply.text(
        truncated, finish_reason="MAX_TOKENS", prompt_tokens=300, completion_tokens=8192
    )
    run_gemini(fast, fake)

    # Not retried (the same prompt truncates again) but bisected: each event alone, once.
    assert [len(r.observations) for r in fake.requests] == [2, 1, 1]
    assert_both_dead_lettered(fast, "MAX_TOKENS", "bisected out of a batch of 2")
    failed = runs(fast)
    assert [len(r[1]) for r in failed] == [2, 1, 1]
    assert set(failed[0][1]) == ids == {failed[1][1][0], failed[2][1][0]}
    for status, _, error, raw, prompt, completion in failed:
        assert (status, raw, prompt, completion) == ("failed", truncated, 300, 8192)
        assert "not JSON" in error
    # Each call's tokens are booked once, against its own run.
    booked = fast.query(
        "SELECT l.units, l.cost_micro_usd = r.cost_micro_usd FROM credit_ledger l"
        " JOIN consolidation_runs r USING (run_id) WHERE l.operation = 'llm'"
    )
    assert booked == [(300 + 8192, True)] * 3
    assert consumed(fast) == []


def test_nested_values_returned_as_json_strings_are_normalized(
    fast: Deployment, fake: FakeGemini
) -> None:
    publish_ada(fast)
    stringly = {
        "updated_working_memory": GOOD["updated_working_memory"],
        "updated_scaffold": json.dumps(
            {"Role": "Engineer", "Projects": json.dumps([{"name": "Falcon", "due": "Dec"}])}
        ),
        "facts": json.dumps(GOOD["facts"]),
    }
    fake.reply(FakeReply.json(stringly))
    run_gemini(fast, fake)

    assert [r[0] for r in runs(fast)] == ["succeeded"]

    def check(c: wiring.Core) -> None:
        scaffold = c.memory.load_state(key_of("ada")).scaffold
        assert scaffold == {"Role": "Engineer", "Projects": [{"name": "Falcon", "due": "Dec"}]}
        assert len(c.memory.facts(key_of("ada"))) == 2

    fast.with_core(check)


def test_an_oversized_working_memory_is_capped(fast: Deployment, fake: FakeGemini) -> None:
    publish_ada(fast)
    huge = " ".join(f"word{i}" for i in range(2_000))
    fake.reply(FakeReply.json({**GOOD, "updated_working_memory": huge}))
    run_gemini(fast, fake)

    assert [r[0] for r in runs(fast)] == ["succeeded"]
    [(stored,)] = fast.query("SELECT working_memory FROM user_memory WHERE user_id = 'ada'")
    assert 0 < len(stored.split()) <= 500
    assert stored.startswith("word0 word1")
