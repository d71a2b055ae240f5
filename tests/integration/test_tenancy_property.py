"""Tenants never meet, whatever the interleaving (hypothesis, through the real pipeline).

Three organizations share user ids and fact texts. Events arrive in a random order, some
published straight to Kafka (where no API guard stands), some through the API with the
organization's token, some reusing another memory's event id. After the pipeline has run,
every read of every memory (context, memory inspection, export, history, replay) holds only
what that memory's own events said. Each example uses organizations of its own, so examples
share the deployment without sharing memories.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from consumers.replay import batches_by_size, shadow_consolidate
from domain.codec import fact_to_json
from domain.ids import MemoryKey
from memoryd import wiring
from memoryd.analyst.export import export_document
from memoryd.api.auth import hash_token
from memoryd.settings import ApiSettings
from processors.fold import fold_runs
from producers.contract import ContextEvent
from store.read.ranking import Budget
from store.write.run_log import PostgresRunLog
from tests.support.builders import make_event
from tests.support.deployment import Deployment
from tests.support.erasure import rows

pytestmark = pytest.mark.integration

ORGS = ("a", "b", "c")
USERS = ("u1", "u2")
SHARED = (
    "I live in Lisbon",
    "I play the cello",
    "My manager is Grace",
    "I am training for the Berlin marathon",
)
QUERY = "What is my codename? Where do I live, what do I play, who is my manager?"


@dataclass(frozen=True)
class Step:
    org: str
    user: str
    shared: int | None  # index into SHARED, or None for a codename only this memory has
    via_api: bool
    reuse_id: bool  # take the previous event's id when that event is another memory's


steps = st.lists(
    st.builds(
        Step,
        st.sampled_from(ORGS),
        st.sampled_from(USERS),
        st.one_of(st.none(), st.integers(0, len(SHARED) - 1)),
        st.booleans(),
        st.booleans(),
    ),
    min_size=3,
    max_size=12,
)


@dataclass
class World:
    """One example: its organizations, events, and each memory's codenames."""

    orgs: dict[str, str]
    events: list[tuple[ContextEvent, bool]]  # (event, through the API)

    def key(self, org: str, user: str) -> MemoryKey:
        return MemoryKey(self.orgs[org], user)

    def of(self, key: MemoryKey) -> list[ContextEvent]:
        return [e for e, _ in self.events if (e.organization_id, e.user_id) == tuple_of(key)]

    def codenames(self, key: MemoryKey) -> set[str]:
        return {e.content.split()[-1].lower() for e in self.of(key) if "codename" in e.content}

    def foreign(self, key: MemoryKey) -> set[str]:
        everyone = {c for k in self.memories() for c in self.codenames(k)}
        return everyone - self.codenames(key)

    def memories(self) -> list[MemoryKey]:
        return [self.key(o, u) for o in ORGS for u in USERS]


def tuple_of(key: MemoryKey) -> tuple[str, str]:
    return (key.organization_id, key.user_id)


def build(plan: Sequence[Step]) -> World:
    suffix = uuid.uuid4().hex[:6]
    orgs = {o: f"org-{o}-{suffix}" for o in ORGS}
    events: list[tuple[ContextEvent, bool]] = []
    for i, step in enumerate(plan):
        codename = f"zq{step.org}{step.user}x{i}y{suffix}"
        text = SHARED[step.shared] if step.shared is not None else f"My codename is {codename}"
        event = make_event(step.user, text, minutes=i, org=orgs[step.org])
        if step.reuse_id and events:
            previous = events[-1][0]
            # Another memory's id, never one this memory already used: within one memory an
            # event id is the idempotency key, so a second content under it is a duplicate.
            here = (event.organization_id, event.user_id)
            mine = {e.event_id for e, _ in events if (e.organization_id, e.user_id) == here}
            if (
                previous.organization_id,
                previous.user_id,
            ) != here and previous.event_id not in mine:
                event = event.model_copy(update={"event_id": previous.event_id})
        events.append((event, step.via_api))
    return World(orgs, events)


def token(org: str) -> str:
    return f"token-of-{org}"


@contextmanager
def api(deployment: Deployment, world: World) -> Iterator[tuple[TestClient, wiring.Core]]:
    tokens = {hash_token(token(o)): o for o in world.orgs.values()}
    s = deployment.settings.model_copy(update={"api": ApiSettings(tokens=tokens)})
    with wiring.core(s) as c, wiring.api_app(c) as app, TestClient(app) as client:
        yield client, c


def bearer(org: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(org)}"}


def publish(deployment: Deployment, client: TestClient, world: World) -> None:
    """In the planned order, one event at a time: straight to Kafka or through the API."""
    for event, via_api in world.events:
        if via_api:
            body = {"events": [event.model_dump(mode="json")]}
            response = client.post("/v1/events", json=body, headers=bearer(event.organization_id))
            assert response.status_code == 202, response.text
        else:
            deployment.publish([event])


def assert_only_its_own(world: World, key: MemoryKey, what: str, doc: Any) -> None:
    """`doc` (anything JSON) names no other memory's codename."""
    text = json.dumps(doc, default=str).lower()
    leaked = {c for c in world.foreign(key) if c in text}
    assert not leaked, f"{what} of {key} holds {leaked}"


def fact_sources(facts: Sequence[dict[str, Any]]) -> set[str]:
    return {str(e) for f in facts for e in f["source_event_ids"]}


def check_memory(
    world: World, key: MemoryKey, client: TestClient, c: wiring.Core, service: Any
) -> None:
    mine = {str(e.event_id) for e in world.of(key)}
    org = key.organization_id
    # Context, through the API and in process.
    body = {"user_id": key.user_id, "query": QUERY, "budget": "deep"}
    context = client.post("/v1/context", json=body, headers=bearer(org)).json()
    assert context["organization_id"] == org
    assert fact_sources([f["fact"]["provenance"] for f in context["facts"]]) <= mine
    assert_only_its_own(world, key, "context", context)
    bundle = service.assemble(key, QUERY, budget=Budget.DEEP)
    assert {tuple_of(r.fact.key) for r in bundle.facts} <= {tuple_of(key)}
    assert {str(e) for r in bundle.facts for e in r.fact.provenance.source_event_ids} <= mine
    assert_only_its_own(world, key, "in-process context", bundle.prompt_block)
    # Memory inspection.
    memory = client.get(f"/v1/users/{key.user_id}/memory", headers=bearer(org))
    if not mine:
        assert memory.status_code == 404
        assert context["facts"] == []
        return
    assert memory.status_code == 200, memory.text
    inspected = memory.json()
    assert inspected["organization_id"] == org
    assert fact_sources([f["provenance"] for f in inspected["facts"]]) <= mine
    assert_only_its_own(world, key, "memory", inspected)
    # The check above would pass on an empty memory. Near-duplicates are merged by the write
    # gate ("my codename is ..." twice keeps the first wording), so one must show, not all.
    own = world.codenames(key)
    assert not own or any(c in json.dumps(inspected).lower() for c in own)
    # Export, history and replay.
    run_log = PostgresRunLog(c.pool)
    export = export_document(c, run_log, key, c.clock())
    assert {e["event_id"] for e in export["events"]} == mine
    assert {e for r in export["runs"] for e in r["input_event_ids"]} <= mine
    assert fact_sources(export["facts"]) <= mine
    assert_only_its_own(world, key, "export", export)
    runs = run_log.runs(key)
    assert {tuple_of(r.run.key) for r in runs} == {tuple_of(key)}
    folded = fold_runs(runs)
    assert set(folded.facts) == {uuid.UUID(f["fact_id"]) for f in export["facts"]}
    assert_only_its_own(world, key, "history", [fact_to_json(f) for f in folded.facts.values()])
    backend, consolidator = wiring.consolidation(c)
    events = [e.event for e in c.events.user_events(key)]
    shadow = shadow_consolidate(key, batches_by_size(events, 10), backend, consolidator)
    assert {
        str(e) for f in shadow.memory.facts.values() for e in f.provenance.source_event_ids
    } <= (mine)
    assert_only_its_own(world, key, "replay", shadow.memory.to_json())


@pytest.mark.timeout(900)
@settings(
    max_examples=10,
    deadline=None,
    # An example is a pipeline run (seconds): shrinking a failure would take far too long,
    # and the failing plan is short enough to read as generated.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=steps)
def test_every_read_returns_only_its_own_organizations_data(
    deployment: Deployment, plan: list[Step]
) -> None:
    world = build(plan)
    with api(deployment, world) as (client, _c):
        publish(deployment, client, world)
    deployment.run_both()
    logged = rows(
        deployment.dsn,
        "SELECT organization_id, user_id, event_id FROM context_events"
        " WHERE organization_id = ANY(%s)",
        (list(world.orgs.values()),),
    )
    sent = {(e.organization_id, e.user_id, e.event_id) for e, _ in world.events}
    assert set(logged) == sent  # every event in its own memory, even under a reused id
    consumed = rows(
        deployment.dsn,
        "SELECT organization_id, user_id, event_id FROM consolidated_events"
        " WHERE organization_id = ANY(%s)",
        (list(world.orgs.values()),),
    )
    assert set(consumed) == sent
    with api(deployment, world) as (client, c), wiring.read_path(c) as service:
        for key in world.memories():
            check_memory(world, key, client, c, service)
