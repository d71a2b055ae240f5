"""`POST /v1/events` on the real broker: a request's events on the topic once each, each
user's in the order sent, and the answer when the broker refuses some of them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fastapi.testclient import TestClient
from kafka import KafkaAdminClient

from memoryd import wiring
from memoryd.api.auth import hash_token
from memoryd.settings import ApiSettings
from producers.contract import ContextEvent
from tests.support.builders import make_event
from tests.support.deployment import (
    Deployment,
    dead_letters,
    headers_of,
    limit_message_bytes,
)

pytestmark = pytest.mark.integration

TOKEN = "token-for-org-a"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# The topic's max.message.bytes, and the API's max_record_bytes, as `memoryd` expects them.
TOPIC_MAX_BYTES = 4096


@contextmanager
def api(deployment: Deployment, max_record_bytes: int | None = None) -> Iterator[TestClient]:
    settings = deployment.settings.model_copy(
        update={"api": ApiSettings(tokens={hash_token(TOKEN): "org-a"})}
    )
    if max_record_bytes is not None:
        kafka = settings.kafka.model_copy(update={"max_record_bytes": max_record_bytes})
        settings = settings.model_copy(update={"kafka": kafka})
    with wiring.core(settings) as c, wiring.api_app(c) as app, TestClient(app) as client:
        yield client


def post(client: TestClient, events: list[ContextEvent]) -> Any:
    return client.post(
        "/v1/events", json={"events": [e.model_dump(mode="json") for e in events]}, headers=AUTH
    )


def on_topic(deployment: Deployment, expected: int) -> dict[bytes, list[str]]:
    """Each memory's event ids as the topic holds them, in offset order."""
    k = deployment.settings.kafka
    # Reads any topic from its start, the event topic as well as a dead-letter one.
    records = dead_letters(k.bootstrap_servers, k.topic, expected + 1, timeout_s=10.0)
    ids: dict[bytes, list[str]] = defaultdict(list)
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        ids[record.key].append(headers_of(record)["event_id"])
    return dict(ids)


def per_memory(events: list[ContextEvent]) -> dict[bytes, list[str]]:
    ids: dict[bytes, list[str]] = defaultdict(list)
    for event in events:
        ids[event.kafka_key].append(str(event.event_id))
    return dict(ids)


def test_a_request_of_many_events_lands_once_each_in_each_users_order(
    deployment: Deployment,
) -> None:
    events = [make_event(f"user-{i % 7}", f"note {i}", minutes=i) for i in range(400)]
    with api(deployment) as client:
        response = post(client, events)
    assert response.status_code == 202
    assert response.json() == {"event_ids": [str(e.event_id) for e in events]}
    assert on_topic(deployment, len(events)) == per_memory(events)


def test_events_the_topic_refuses_are_named_and_the_others_are_on_it(
    deployment: Deployment, kafka_admin: KafkaAdminClient
) -> None:
    limit_message_bytes(kafka_admin, deployment.settings.kafka.topic, TOPIC_MAX_BYTES)
    big = make_event("ada", "x" * (TOPIC_MAX_BYTES + 1000), minutes=1)
    events = [
        make_event("ada", "I live in Lisbon"),
        make_event("bob", "I play the cello"),
        big,
        make_event("bob", "I moved to Porto", minutes=2),
        make_event("ada", "I moved to Porto", minutes=3),
    ]
    accepted = [e for e in events if e is not big]
    later = make_event("ada", "I learn Portuguese", minutes=4)
    with api(deployment, max_record_bytes=TOPIC_MAX_BYTES) as client:
        response = post(client, events)
        # The refusal cost that one event only: the producer takes the next request whole.
        assert post(client, [later]).status_code == 202
    # Sending the refused event again would be refused again: not a 503.
    assert response.status_code == 422
    body = response.json()
    assert body["event_ids"] == [str(e.event_id) for e in accepted]
    (refused,) = body["not_accepted"]
    assert (refused["event_id"], refused["retriable"]) == (str(big.event_id), False)
    assert "MessageSizeTooLarge" in refused["reason"]
    assert on_topic(deployment, len(accepted) + 1) == per_memory([*accepted, later])


def test_after_the_broker_refuses_an_event_the_next_request_is_accepted(
    deployment: Deployment, kafka_admin: KafkaAdminClient
) -> None:
    # The topic's limit below the API's (its default): the broker, not the producer, refuses.
    limit_message_bytes(kafka_admin, deployment.settings.kafka.topic, TOPIC_MAX_BYTES)
    big = make_event("ada", "x" * (TOPIC_MAX_BYTES + 1000))
    later = make_event("ada", "I learn Portuguese", minutes=1)
    with api(deployment) as client:
        refused = post(client, [big])
        accepted = post(client, [later])
    assert refused.status_code == 422
    assert accepted.status_code == 202
    assert on_topic(deployment, 1) == per_memory([later])
