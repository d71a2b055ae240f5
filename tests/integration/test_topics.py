"""The event and dead-letter topics get the configured retention, created or found, and the
event topic the producer's record limit when created here."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType

from memoryd.ops import topics
from memoryd.ops.topics import TopicConfigError, ensure_topics
from memoryd.settings import KafkaSettings, Settings
from tests.support.deployment import max_message_bytes, wait_until

pytestmark = pytest.mark.integration

DAY_MS = 86_400_000


def retention(admin: KafkaAdminClient, topic: str) -> str:
    described = admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all"
    )
    return str(described["topic"][topic]["retention.ms"]["value"])


@pytest.fixture
def names(kafka_admin: KafkaAdminClient) -> Iterator[list[str]]:
    run = uuid.uuid4().hex[:12]
    chosen = [f"events-{run}", f"events-{run}.dlq"]
    yield chosen
    present = [n for n in chosen if n in set(kafka_admin.list_topics())]
    if present:
        kafka_admin.delete_topics(present)


def settings_for(
    bootstrap: str, names: list[str], retention_days: int, max_record_bytes: int = 1_048_576
) -> Settings:
    kafka = KafkaSettings(
        bootstrap_servers=bootstrap,
        topic=names[0],
        dead_letter_topic=names[1],
        partitions=2,
        retention_ms=retention_days * DAY_MS,
        max_record_bytes=max_record_bytes,
    )
    return Settings().model_copy(update={"kafka": kafka})


def test_topics_created_here_get_the_retention_at_once(
    kafka_bootstrap: str, kafka_admin: KafkaAdminClient, names: list[str]
) -> None:
    ensure_topics(settings_for(kafka_bootstrap, names, 3))
    assert [retention(kafka_admin, n) for n in names] == [str(3 * DAY_MS)] * 2


def test_topics_found_get_the_configured_retention(
    kafka_bootstrap: str, kafka_admin: KafkaAdminClient, names: list[str]
) -> None:
    ensure_topics(settings_for(kafka_bootstrap, names, 3))
    ensure_topics(settings_for(kafka_bootstrap, names, 9))  # both exist now
    # The controller took the change when the call returned; the broker describing the topic
    # applies it from the metadata log a moment later (KRaft), so it is read until it does.
    wait_until(
        lambda: [retention(kafka_admin, n) for n in names] == [str(9 * DAY_MS)] * 2,
        10,
        "the broker to describe the new retention",
    )


def test_the_event_topic_created_here_takes_records_as_large_as_the_producer_sends(
    kafka_bootstrap: str, kafka_admin: KafkaAdminClient, names: list[str]
) -> None:
    found = ensure_topics(settings_for(kafka_bootstrap, names, 3, max_record_bytes=200_000))
    assert max_message_bytes(kafka_admin, names[0]) == "200000"
    assert found == []
    # The dead-letter topic keeps the broker's: a letter wraps a record, and is larger.
    assert max_message_bytes(kafka_admin, names[1]) != "200000"


def test_an_event_topic_found_below_the_producers_limit_is_reported_and_left(
    kafka_bootstrap: str, kafka_admin: KafkaAdminClient, names: list[str]
) -> None:
    ensure_topics(settings_for(kafka_bootstrap, names, 3, max_record_bytes=200_000))
    found = ensure_topics(settings_for(kafka_bootstrap, names, 3, max_record_bytes=300_000))
    (note,) = found
    assert names[0] in note
    assert "max.message.bytes=200000" in note
    assert "300000" in note
    assert max_message_bytes(kafka_admin, names[0]) == "200000"
    # A topic taking larger records than the producer sends agrees with it.
    assert ensure_topics(settings_for(kafka_bootstrap, names, 3, max_record_bytes=100_000)) == []


def test_a_configuration_the_broker_refuses_stops_the_caller(
    kafka_bootstrap: str,
    kafka_admin: KafkaAdminClient,
    kafka_topic_factory: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = kafka_topic_factory()
    monkeypatch.setattr(topics, "ALTER_PATIENCE_S", 0.0)
    with pytest.raises(TopicConfigError, match=topic):
        # Kafka takes retention.ms from -1 (forever) up.
        topics._alter(kafka_admin, [topic], {"retention.ms": "-5"}, sleep=lambda _: None)
