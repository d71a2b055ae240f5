"""The LLM path after a year of memory, through the real pipeline and the real google-genai SDK.

- A correction meets the fact it corrects among thousands, however old, unpinned and dull.
- One poison event in a batch of 20 is bisected out: 19 consolidated in one run, 1 dead letter.
- An answer that cannot be used is still paid for: its tokens are in the failed run and the
  ledger, once.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from consumers.batching import Rejection
from domain.ids import MemoryKey, fact_id_for
from domain.model import (
    Fact,
    FactType,
    TokenUsage,
)
from memoryd import wiring
from processors.cost import PriceTable
from producers.contract import EventType
from tests.support.builders import BASE_TIME, buffered, make_event, make_fact
from tests.support.deployment import (
    Deployment,
    dead_letters,
    gemini_backend,
    headers_of,
    tuned,
)
from tests.support.fake_gemini import FakeGemini, FakeReply, RecordedRequest

pytestmark = pytest.mark.integration

ORG = "org-a"
CITIES = ["Lisbon", "Kyoto", "Oslo", "Lima", "Pune", "Austin", "Lyon", "Seoul", "Accra", "Turin"]
TOPICS = [
    "The user booked a table at a {adj} restaurant in {city} for visit {n}.",
    "The user read {n} pages of a {adj} novel set in {city}.",
    "The user's team shipped release {n} of the {adj} {city} dashboard.",
    "The user ran {n} kilometres along the {adj} river path in {city}.",
    "The user bought {n} {adj} postcards in {city}.",
    "The user reviewed pull request {n} about the {adj} {city} importer.",
]
ADJECTIVES = ["quiet", "busy", "green", "old", "small", "new", "long", "bright"]
TARGET = "The user's dentist is Dr. Alvarez in Porto."


@pytest.fixture
def fake() -> Iterator[FakeGemini]:
    with FakeGemini() as server:
        yield server


def seeded_fact(user: str, content: str, *, days_ago: float, salience: float, pinned: bool) -> Fact:
    return make_fact(
        user,
        content,
        org=ORG,
        at=BASE_TIME - timedelta(days=days_ago),
        fact_type=FactType.EPISODIC,
        salience=salience,
        pinned=pinned,
        created_by_run=uuid.uuid5(uuid.NAMESPACE_URL, f"seed/{user}"),
    )


def a_year_of_memory(user: str, count: int) -> list[Fact]:
    """`count` facts: recent, more salient than the target, 1 % pinned; the target is the
    oldest and the least salient, so no 'pinned, salient, recent' cut would show it."""
    rng = random.Random(7)
    texts: dict[str, None] = {}
    while len(texts) < count - 1:
        template = rng.choice(TOPICS)
        texts[
            template.format(adj=rng.choice(ADJECTIVES), city=rng.choice(CITIES), n=len(texts))
        ] = None
    facts = [
        seeded_fact(
            user,
            text,
            days_ago=rng.uniform(0, 90),
            salience=round(rng.uniform(0.4, 0.9), 2),
            pinned=rng.random() < 0.01,
        )
        for text in texts
    ]
    return [*facts, seeded_fact(user, TARGET, days_ago=700, salience=0.1, pinned=False)]


def fact_op(op: str, content: str, label: str, target: str | None = None) -> dict[str, Any]:
    return {
        "op": op,
        "content": content,
        "type": "profile",
        "confidence": 0.95,
        "salience": 0.6,
        "surface": "speak",
        "target_fact_id": target,
        "evidence": [label],
    }


def dentist_model(request: RecordedRequest) -> FakeReply:
    """Corrects the dentist fact if the prompt shows it, else can only add a new one."""
    shown = [fact_id for fact_id, text in request.facts if "dentist" in text]
    [(label, _)] = request.observations
    new = "The user's dentist is Dr. Okafor in Porto."
    op = fact_op("contradict", new, label, shown[0]) if shown else fact_op("add", new, label)
    answer = {"updated_working_memory": "", "updated_scaffold": {}, "facts": [op]}
    return FakeReply.json(answer, prompt_tokens=None)


def test_a_correction_meets_the_old_dull_fact_it_corrects_among_5000(
    deployment: Deployment, fake: FakeGemini
) -> None:
    facts = a_year_of_memory("ada", 5_000)
    target_id = fact_id_for(MemoryKey(ORG, "ada"), TARGET, None)

    def seed(c: wiring.Core) -> int:
        assert c.memory.insert_facts(facts) == 5_000
        assert c.memory.insert_facts(facts[:10]) == 0  # idempotent
        return wiring.indexer(c).drain_pending(batch=1_000)

    assert deployment.with_core(seed) == 5_000
    correction = make_event(
        "ada", "Correction: my dentist is Dr. Okafor now, not Dr. Alvarez", EventType.CORRECTION
    )
    deployment.publish([correction])
    fake.responder = dentist_model
    with gemini_backend(fake.url) as backend:
        deployment.run_processor(backend)

    [request] = fake.requests
    assert str(target_id) in request.user_text
    assert "shown of 5000)" in request.user_text
    assert len(request.facts) < 60, "the prompt shows the related facts, not the memory"
    [(status, output)] = deployment.query("SELECT status, output FROM consolidation_runs")
    assert status == "succeeded"
    [decision] = output["gate_decisions"]
    assert decision["op"] == "contradict"
    rows = deployment.query(
        "SELECT fact_id, content, status, superseded_by FROM memory_facts"
        " WHERE content LIKE %s ORDER BY created_at",
        ("%dentist%",),
    )
    assert [(r[0], r[2]) for r in rows] == [
        (target_id, "contradicted"),
        (rows[1][0], "active"),
    ]
    assert rows[0][3] == rows[1][0], "the old fact points at the one that replaced it"
    assert rows[1][1] == "The user's dentist is Dr. Okafor in Porto."
    [(active,)] = deployment.query("SELECT count(*) FROM memory_facts WHERE status = 'active'")
    assert active == 5_000, "one fact replaced by one, no duplicate"


POISON = "POISON"


def note_taker(request: RecordedRequest) -> FakeReply:
    """One fact per observation; a batch holding the poison event gets a truncated answer."""
    observations = request.observations
    if any(POISON in text for _, text in observations):
        return FakeReply.text('{"updated_working_memory": "The user', "MAX_TOKENS", None, 8192)
    answer = {
        "updated_working_memory": f"The user made {len(observations)} notes.",
        "updated_scaffold": {"Notes": len(observations)},
        "facts": [fact_op("add", f"The user noted: {text}", label) for label, text in observations],
    }
    return FakeReply.json(answer, prompt_tokens=None, completion_tokens=40 * len(observations))


def test_one_poison_event_is_bisected_out_of_a_batch_of_twenty(
    deployment: Deployment, fake: FakeGemini
) -> None:
    deployment = tuned(deployment, max_batch=20, max_wait_s=5.0)
    events = [
        make_event("ada", f"I finished chapter {i} of the {CITIES[i % 10]} travel guide", minutes=i)
        for i in range(20)
    ]
    poison = events[13] = make_event("ada", f"{POISON} " + "~" * 500, minutes=13)
    deployment.publish(events)
    fake.responder = note_taker
    with gemini_backend(fake.url) as backend:
        deployment.run_processor(backend)

    good = {e.event_id for e in events} - {poison.event_id}
    consumed = {r[0] for r in deployment.query("SELECT event_id FROM consolidated_events")}
    assert consumed == good
    [(run_id, inputs)] = deployment.query(
        "SELECT run_id, input_event_ids FROM consolidation_runs WHERE status = 'succeeded'"
    )
    assert set(inputs) == good
    k = deployment.settings.kafka
    [letter] = dead_letters(k.bootstrap_servers, k.dead_letter_topic, expected=1, timeout_s=15)
    assert json.loads(letter.value)["event_id"] == str(poison.event_id)
    assert "MAX_TOKENS" in headers_of(letter)["dlq.reason"]
    assert "bisected out of a batch of 20" in headers_of(letter)["dlq.reason"]
    # The poison's own failure is on record, alone; the probes that answered usably too.
    statuses = deployment.query(
        "SELECT status, input_event_ids FROM consolidation_runs WHERE status <> 'succeeded'"
    )
    assert [poison.event_id] in [ids for status, ids in statuses if status == "failed"]
    assert {status for status, _ in statuses} == {"failed", "discarded"}
    assert len(fake.requests) <= 1 + 12 + 1  # the batch, the probes' cap, the good events

    # The succeeded run's entries, and one entry per call for exactly its tokens.
    ops = deployment.query("SELECT operation FROM credit_ledger WHERE run_id = %s", (run_id,))
    assert sorted({op for (op,) in ops}) == ["embedding", "llm"]
    calls = deployment.query(
        "SELECT r.prompt_tokens + r.completion_tokens, l.units, r.cost_micro_usd,"
        " l.cost_micro_usd FROM consolidation_runs r LEFT JOIN credit_ledger l"
        " ON l.run_id = r.run_id AND l.operation = 'llm'"
    )
    assert len(calls) == len(fake.requests)
    for tokens, units, run_cost, entry_cost in calls:
        assert tokens > 0
        assert (units, entry_cost) == (tokens, run_cost)


def test_an_unusable_answer_is_booked_in_its_failed_run_and_the_ledger_once(
    deployment: Deployment, fake: FakeGemini
) -> None:
    text = "Sure! Here is the memory you asked for: {updated_working_memory: ..."
    fake.reply(FakeReply.text(text, prompt_tokens=1_234, completion_tokens=56))
    deployment.publish([make_event("ada", "I work in engineering at Initech")])
    with gemini_backend(fake.url) as backend:
        deployment.run_processor(backend)

    [(run_id, status, raw, prompt, completion, cost)] = deployment.query(
        "SELECT run_id, status, raw_response, prompt_tokens, completion_tokens, cost_micro_usd"
        " FROM consolidation_runs"
    )
    prices = PriceTable(deployment.settings.prices)
    expected = prices.llm_cost_micro_usd("gemini-2.5-flash", TokenUsage(1_234, 56))
    assert (status, raw, prompt, completion, cost) == ("failed", text, 1_234, 56, expected)
    assert expected > 0
    ledger = deployment.query(
        "SELECT run_id, operation, model, units, cost_micro_usd FROM credit_ledger"
    )
    assert ledger == [(run_id, "llm", "gemini-2.5-flash", 1_290, expected)]

    # Recording a failed run again (a retry after Postgres dropped the commit's answer, say)
    # writes it, and books it, once.
    def record_twice(c: wiring.Core) -> None:
        events = [make_event("bo", "I live in Lisbon")]
        rejection = Rejection("consolidate", "gave up", "refused", usage=TokenUsage(100, 10))
        flusher = wiring.flusher(c, *wiring.consolidation(c))
        try:
            for _ in range(2):
                flusher.record_failure(MemoryKey(ORG, "bo"), buffered(events), 3, rejection)
        finally:
            flusher.close()

    deployment.with_core(record_twice)
    assert deployment.query(
        "SELECT count(*), sum(units) FROM credit_ledger WHERE user_id = 'bo'"
    ) == [(1, 110)]
    assert deployment.query("SELECT count(*) FROM consolidation_runs WHERE user_id = 'bo'") == [
        (1,)
    ]
