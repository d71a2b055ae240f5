"""A record the broker refuses costs that record only: the publisher's next request goes
through, on the real broker, even when the topic's limit is below the producer's."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from kafka import KafkaAdminClient

from producers.errors import PublishError
from producers.publisher import KafkaEventPublisher, ProducerSettings
from tests.support.builders import make_event
from tests.support.deployment import limit_message_bytes, topic_size

pytestmark = pytest.mark.integration

# The topic's limit, below the producer's own (its default, 1 MiB): the broker refuses.
TOPIC_MAX_BYTES = 4096
TOO_BIG = "x" * (TOPIC_MAX_BYTES + 1000)


@pytest.fixture
def topic(kafka_admin: KafkaAdminClient, kafka_topic_factory: Callable[..., str]) -> str:
    name = kafka_topic_factory()
    limit_message_bytes(kafka_admin, name, TOPIC_MAX_BYTES)
    return name


@pytest.fixture
def publisher(kafka_bootstrap: str, topic: str) -> Iterator[KafkaEventPublisher]:
    made = KafkaEventPublisher(ProducerSettings(kafka_bootstrap, topic, delivery_timeout_ms=15_000))
    yield made
    made.close()


def test_after_the_broker_refuses_a_record_the_next_publish_is_acknowledged(
    kafka_bootstrap: str, topic: str, publisher: KafkaEventPublisher
) -> None:
    publisher.publish([make_event("ada", "I live in Lisbon")])
    with pytest.raises(PublishError) as refused:
        publisher.publish([make_event("ada", TOO_BIG, minutes=1)])
    (undelivered,) = refused.value.undelivered
    # The same record would be refused again.
    assert (undelivered.position, undelivered.retriable) == (0, False)
    assert "MessageSizeTooLarge" in undelivered.reason

    publisher.publish([make_event("ada", "I moved to Porto", minutes=2)])
    publisher.publish([make_event("bob", f"note {i}", minutes=i) for i in range(20)])
    assert topic_size(kafka_bootstrap, topic) == 1 + 1 + 20


def test_the_events_caught_up_in_a_refusal_may_be_sent_again(
    topic: str, publisher: KafkaEventPublisher
) -> None:
    # One partition: the events after the refused one are behind it, and the producer stops
    # sending when the broker refuses it.
    events = [
        make_event("ada", TOO_BIG),
        *(make_event("ada", f"n{i}", minutes=i) for i in range(1, 200)),
    ]
    with pytest.raises(PublishError) as refused:
        publisher.publish(events)
    undelivered = {u.position: u.retriable for u in refused.value.undelivered}
    assert undelivered[0] is False
    others = {p: r for p, r in undelivered.items() if p != 0}
    assert others, "no event was caught up: the case is not exercised"
    assert set(others.values()) == {True}

    publisher.publish([events[i] for i in sorted(others)])
