"""A publisher closes within its request timeout while its broker hangs.

kafka-python 3.0.12's `close()` waits with no limit for the records its producer holds. Those
of an idempotent producer whose broker stopped answering never expire: a record that timed
out after it was sent resets the producer's id, and until the broker gives a new one the
producer sends nothing and expires nothing. A stopping API or redrive never exited.
"""

from __future__ import annotations

import gc
import logging
import threading
import time

import pytest
from kafka.admin import KafkaAdminClient, NewTopic

from memoryd.dev import LocalKafka
from producers.errors import PublishError
from producers.publisher import KafkaEventPublisher, ProducerSettings
from tests.support.builders import make_event
from tests.support.services import frozen

pytestmark = [
    pytest.mark.integration,
    pytest.mark.faults,
    pytest.mark.timeout(300),
    # kafka-python's own: a socket it dropped unclosed, closed by the collector with a warning.
    pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning"),
]
REQUEST_TIMEOUT_MS = 1_000
DELIVERY_TIMEOUT_MS = 3_000


def test_a_publisher_whose_broker_hangs_closes_in_time(
    own_kafka: LocalKafka, caplog: pytest.LogCaptureFixture
) -> None:
    # Captured, kafka-python's records of failed connections keep their sockets (tracebacks).
    caplog.set_level(logging.CRITICAL, logger="kafka")
    # The publisher's own records captured again: the call above left the capture at CRITICAL.
    caplog.set_level(logging.WARNING, logger="producers.publisher")
    topic = "events"
    admin = KafkaAdminClient(bootstrap_servers=own_kafka.bootstrap)
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        admin.close()
    settings = ProducerSettings(
        own_kafka.bootstrap,
        topic,
        delivery_timeout_ms=DELIVERY_TIMEOUT_MS,
        request_timeout_ms=REQUEST_TIMEOUT_MS,
        client_id="closing",
    )
    publisher = KafkaEventPublisher(settings)
    publisher.publish([make_event("ada", "I live in Lisbon")])  # the producer has its id

    with frozen(own_kafka):
        # The first record is sent, unanswered, and expires: the producer drops its id. The
        # later ones wait for a new id, which never comes while the broker hangs.
        for minutes in (1, 2, 3):
            with pytest.raises(PublishError):
                publisher.publish([make_event("ada", f"note {minutes}", minutes=minutes)])

        closing = threading.Thread(target=publisher.close, daemon=True)
        started = time.monotonic()
        closing.start()
        closing.join(REQUEST_TIMEOUT_MS / 1000 + 10)  # slack for a loaded machine
        waited = time.monotonic() - started
        assert not closing.is_alive(), f"publisher.close still waiting after {waited:.0f}s"
    assert not [t for t in threading.enumerate() if t.name == "closing-network-thread"]
    assert "record(s) unacknowledged: given up" in caplog.text
    gc.collect()  # the dropped sockets, while the filter above applies
