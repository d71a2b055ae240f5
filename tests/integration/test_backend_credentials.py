"""The real google-genai SDK against the local fake Gemini refusing memoryd's key for a while,
through the real pipeline: a credentials problem is an outage of the provider, waited out
with the consumer degraded, never data sent to the dead-letter topic.

A single memory, and more refusals than the batch has attempts: neither the rule that one
memory failing alone is no outage nor the attempts apply to a refused key.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from memoryd import wiring
from producers.contract import EventType
from tests.support.builders import make_event
from tests.support.deployment import Deployment, gemini_backend, letter_count, tuned
from tests.support.fake_gemini import FakeGemini, FakeReply

pytestmark = pytest.mark.integration

GOOD: dict[str, Any] = {
    "updated_working_memory": "Ada is an engineer at Initech.",
    "updated_scaffold": {"Role": "Engineer", "Employer": "Initech"},
    "facts": [],
}
REFUSALS = 4  # more than the batch's three attempts


@pytest.fixture
def fake() -> Iterator[FakeGemini]:
    with FakeGemini() as server:
        yield server


@pytest.mark.parametrize(
    "refusal",
    [
        pytest.param(FakeReply.status(401, "Request had invalid credentials"), id="401"),
        # What the API answers for a revoked or expired key.
        pytest.param(
            FakeReply.status(
                400, "API key expired. Please renew the API key.", reason="API_KEY_INVALID"
            ),
            id="key expired",
        ),
    ],
)
def test_a_refused_key_is_waited_out_then_consolidated_nothing_dead_lettered(
    deployment: Deployment, fake: FakeGemini, refusal: FakeReply
) -> None:
    fast = tuned(deployment, backoff_base_s=0.05, max_attempts=3)
    events = [
        make_event("ada", "I work in engineering at Initech", minutes=0),
        make_event("ada", "I prefer short answers", EventType.PREFERENCE, minutes=1),
    ]
    fast.publish(events)
    fake.reply(*[refusal] * REFUSALS)
    fake.default = FakeReply.json(GOOD)

    def run(c: wiring.Core) -> dict[str, float | None]:
        with gemini_backend(fake.url) as backend:
            fast.processor(c, backend).run_until_idle(idle_s=2.0)
        auth = {"consumer": "processor", "cause": "backend_auth"}
        return {
            "retries": c.registry.get_sample_value("memoryd_outage_retries_total", auth),
            "degraded": c.registry.get_sample_value(
                "memoryd_consumer_degraded", {"consumer": "processor"}
            ),
        }

    seen = fast.with_core(run)

    assert len(fake.requests) == REFUSALS + 1
    k = fast.settings.kafka
    assert letter_count(k.bootstrap_servers, k.dead_letter_topic) == 0
    # One run, the one that landed, at its first attempt: the refusals charged none.
    assert fast.query("SELECT status, attempt FROM consolidation_runs") == [("succeeded", 0)]
    consumed = {r[0] for r in fast.query("SELECT event_id FROM consolidated_events")}
    assert consumed == {e.event_id for e in events}
    assert seen == {"retries": REFUSALS, "degraded": 0.0}
