"""A user out of credit: the configured budget policy applies, and says so in the records.

Each Gemini answer costs 155 micro-dollars (100 prompt tokens at $0.30/Mtok, 50 completion
tokens at $2.50/Mtok); a credit of 100 is spent by the first run, so the second finds the
balance at -55.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from typing import Any

import pytest

from consumers.flush import BudgetPolicy
from memoryd import wiring
from memoryd.analyst.dead_letters import read_dead_letters
from memoryd.erasure import ErasureRequest
from memoryd.jobs import drain_index_once
from memoryd.redrive import redrive
from producers.contract import ContextEvent, EventType, Source
from tests.support.builders import key_of, make_event
from tests.support.deployment import Deployment, dead_letters, gemini_backend, headers_of, tuned
from tests.support.fake_gemini import FakeGemini, FakeReply

pytestmark = pytest.mark.integration

RUN_COST = 155
CREDIT = 100
ERASURE = ErasureRequest("test", "asked by the user")


@pytest.fixture
def fake() -> Iterator[FakeGemini]:
    with FakeGemini() as server:
        yield server


def answer(content: str) -> FakeReply:
    payload = {
        "updated_working_memory": f"Latest: {content}",
        "updated_scaffold": {},
        "facts": [{"op": "add", "content": content, "type": "profile", "confidence": 0.9,
                   "salience": 0.6, "surface": "speak", "evidence": ["E1"]}],
    }  # fmt: skip
    return FakeReply.json(payload, prompt_tokens=100, completion_tokens=50)


def consolidate(deployment: Deployment, fake: FakeGemini, text: str) -> Any:
    event = make_event("ada", text)
    consolidate_event(deployment, fake, event)
    return event.event_id


def consolidate_event(deployment: Deployment, fake: FakeGemini, *events: ContextEvent) -> None:
    deployment.publish(events)
    with gemini_backend(fake.url) as backend:
        deployment.run_processor(backend)


def set_credit(deployment: Deployment, micro_usd: int) -> None:
    deployment.with_core(lambda c: c.memory.set_credit(key_of("ada"), micro_usd))


def balance(deployment: Deployment) -> int | None:
    result: int | None = deployment.with_core(lambda c: c.memory.balance(key_of("ada")))
    return result


def runs(deployment: Deployment) -> list[tuple[Any, ...]]:
    return deployment.query(
        "SELECT status, input_event_ids, error, output->>'budget_action' FROM consolidation_runs"
        " ORDER BY seq"
    )


def test_defer_parks_the_events_until_credit_is_added(
    deployment: Deployment, fake: FakeGemini
) -> None:
    set_credit(deployment, CREDIT)
    fake.reply(answer("The user works at Initech."))
    first = consolidate(deployment, fake, "I work at Initech")
    assert balance(deployment) == CREDIT - RUN_COST

    second = consolidate(deployment, fake, "I live in Lisbon")
    assert len(fake.requests) == 1  # no LLM call for a user out of credit
    (_, (status, inputs, error, _)) = runs(deployment)
    assert (status, inputs) == ("deferred", [second])
    assert "credit exhausted" in error
    k = deployment.settings.kafka
    [letter] = dead_letters(k.bootstrap_servers, k.dead_letter_topic, expected=1)
    assert headers_of(letter)["dlq.stage"] == "budget"
    assert "credit exhausted" in headers_of(letter)["dlq.reason"]
    consumed = {r[0] for r in deployment.query("SELECT event_id FROM consolidated_events")}
    assert consumed == {first}
    assert balance(deployment) == CREDIT - RUN_COST  # deferring costs nothing

    set_credit(deployment, 10_000)
    assert redrive(deployment.settings).redriven == 1
    fake.reply(answer("The user lives in Lisbon."))
    with gemini_backend(fake.url) as backend:
        deployment.run_processor(backend)
    assert [(r[0], r[1]) for r in runs(deployment)] == [
        ("succeeded", [first]),
        ("deferred", [second]),
        ("succeeded", [second]),  # its own run record, not shadowed by the deferred one
    ]
    consumed = {r[0] for r in deployment.query("SELECT event_id FROM consolidated_events")}
    assert consumed == {first, second}
    assert balance(deployment) == 10_000 - 2 * RUN_COST


def test_defer_letters_only_the_events_it_parks(deployment: Deployment, fake: FakeGemini) -> None:
    set_credit(deployment, CREDIT)
    fake.reply(answer("The user works at Initech."))
    first = make_event("ada", "I work at Initech")
    consolidate_event(deployment, fake, first)  # spends the credit
    with wiring.core(deployment.settings) as c, closing(wiring.publisher(c.settings)) as pub:
        (fact,) = c.memory.facts(key_of("ada"))
        # Learned again in the fact's own words and logged, not yet consolidated, when the fact
        # is erased: its logged copy is redacted, the one in Kafka is not.
        learned = make_event(
            "ada", fact.content, EventType.LEARNED_FACT, source=Source.AUTONOMOUS, minutes=5
        )
        deployment.publish([learned])
        deployment.run_log_writer()
        wiring.eraser(c, pub).erase_fact(key_of("ada"), fact.fact_id, ERASURE)
    fresh = make_event("ada", "I live in Lisbon", minutes=6)
    # `first` read again (as after a crash before its offset was committed), in one batch with
    # the redacted observation and a fresh one.
    consolidate_event(deployment, fake, first, fresh)

    assert len(fake.requests) == 1
    assert [(r[0], r[1]) for r in runs(deployment)] == [
        ("succeeded", [first.event_id]),
        ("deferred", [fresh.event_id]),
    ]
    k = deployment.settings.kafka
    letters = read_dead_letters(k.bootstrap_servers, k.dead_letter_topic)
    assert [(x.stage, x.event_id) for x in letters] == [("budget", fresh.event_id)]


def test_skip_embeddings_consolidates_but_indexes_only_after_a_top_up(
    deployment: Deployment, fake: FakeGemini
) -> None:
    skipping = tuned(deployment, budget_policy=BudgetPolicy.SKIP_EMBEDDINGS)
    set_credit(skipping, CREDIT)
    fake.reply(answer("The user works at Initech."), answer("The user lives in Lisbon."))
    consolidate(skipping, fake, "I work at Initech")
    consolidate(skipping, fake, "I live in Lisbon")

    assert len(fake.requests) == 2
    assert [(r[0], r[3]) for r in runs(skipping)] == [
        ("succeeded", None),
        ("succeeded", "skip_embeddings"),
    ]
    pending = skipping.query(
        "SELECT content FROM memory_facts WHERE indexed_at IS NULL ORDER BY content"
    )
    assert pending == [("The user lives in Lisbon.",)]

    def index_state(c: wiring.Core) -> tuple[int | None, int, float | None]:
        drained = drain_index_once(c)
        gauge = c.registry.get_sample_value("memoryd_facts_pending_index")
        return drained, c.index.count(key_of("ada")), gauge

    # The scheduled drain leaves them alone while the user is out of credit, and the pending
    # gauge (whose alert reads a backlog as Chroma down) does not count them...
    assert skipping.with_core(index_state) == (0, 1, 0.0)
    assert skipping.query("SELECT count(*) FROM memory_facts WHERE indexed_at IS NULL") == [(1,)]
    # ...and indexes them once credit is added.
    set_credit(skipping, 10_000)
    assert skipping.with_core(index_state) == (1, 2, 0.0)
    assert skipping.query("SELECT count(*) FROM memory_facts WHERE indexed_at IS NULL") == [(0,)]
