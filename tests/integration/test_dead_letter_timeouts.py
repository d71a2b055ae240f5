"""A dead-letter transaction whose broker goes away ends within the sink's timeout.

kafka-python 3.0.12 waits for a transaction's end with no limit: with its coordinator
unreachable, `sink.send` blocked the consumer's poll thread until the group evicted it, and
the records it held were never retried. Bounded, the send raises `DeadLetterError` (the
records stay open, an outage the consumer rides out), and the sink works again once the broker
is back.
"""

from __future__ import annotations

import gc
import logging
import threading
import time

import pytest
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.structs import TopicPartition as KafkaTopicPartition

from consumers.batching import TopicPartition
from consumers.dead_letter import DeadLetter, KafkaDeadLetterSink
from consumers.errors import DeadLetterError
from memoryd.analyst.dead_letters import read_dead_letters
from memoryd.dev import LocalKafka
from tests.support.deployment import committed

pytestmark = [
    pytest.mark.integration,
    pytest.mark.faults,
    pytest.mark.timeout(300),
    # kafka-python's own: a socket whose connection was refused is dropped unclosed
    # (kafka.net.inet), and the collector closes it with this warning.
    pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning"),
]
TIMEOUT_S = 3.0
# The letters' acknowledgement, then the abort: each waits at most TIMEOUT_S.
BOUND_S = 3 * TIMEOUT_S


def send_in_time(
    sink: KafkaDeadLetterSink, letter: DeadLetter, source: str
) -> BaseException | None:
    """The sink's send in a thread, so a send that never returns fails the test, not hangs it:
    what it raised (None if nothing)."""
    outcome: list[BaseException | None] = []

    def send() -> None:
        try:
            sink.send([letter], {TopicPartition(source, 0): letter.offset + 1}, "letters")
            outcome.append(None)
        except DeadLetterError as e:
            outcome.append(e)

    thread = threading.Thread(target=send, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(BOUND_S + 10)  # slack for a loaded machine; unbounded, it never returns
    assert outcome, f"sink.send still waiting after {time.monotonic() - started:.0f}s"
    return outcome[0]


def make_topics(bootstrap: str, *topics: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(t, 1, 1) for t in topics])
    finally:
        admin.close()


def test_a_send_while_the_broker_is_away_fails_in_time_and_the_sink_recovers(
    own_kafka: LocalKafka, caplog: pytest.LogCaptureFixture
) -> None:
    # Captured, kafka-python's records of refused connections keep the sockets (tracebacks).
    caplog.set_level(logging.CRITICAL, logger="kafka")
    source, dlq = "events", "dlq"
    make_topics(own_kafka.bootstrap, source, dlq)
    sink = KafkaDeadLetterSink(own_kafka.bootstrap, dlq, "timeouts", timeout_s=TIMEOUT_S)
    first, second = (
        DeadLetter(None, b"not json", "decode", "not JSON", source, 0, i) for i in (0, 1)
    )
    assert send_in_time(sink, first, source) is None  # transactions initialised, coordinator known

    own_kafka.stop()
    refused = send_in_time(sink, second, source)
    assert isinstance(refused, DeadLetterError), refused
    # The producer it dropped is closed: its I/O thread does not stay, one per attempt.
    assert not [t for t in threading.enumerate() if t.name == "timeouts-dlq-network-thread"]

    own_kafka.start(timeout=180)
    # As the consumer would: again until the restarted broker's coordinator has loaded.
    deadline = time.monotonic() + 60
    while (again := send_in_time(sink, second, source)) is not None:
        assert time.monotonic() < deadline, again
    sink.close()
    seen = read_dead_letters(own_kafka.bootstrap, dlq)
    assert sorted(x.source for x in seen) == [(source, 0, 0), (source, 0, 1)]
    assert committed(own_kafka.bootstrap, "letters", KafkaTopicPartition(source, 0)) == 2
    gc.collect()  # the refused connections' sockets, while the filter above applies


def test_a_sink_closed_with_a_transaction_open_while_the_broker_is_away_closes_in_time(
    own_kafka: LocalKafka, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.CRITICAL, logger="kafka")  # as above
    # Its own records captured again: the call above left the capture at CRITICAL.
    caplog.set_level(logging.WARNING, logger="consumers.dead_letter")
    source, dlq = "events", "dlq"
    make_topics(own_kafka.bootstrap, source, dlq)
    sink = KafkaDeadLetterSink(own_kafka.bootstrap, dlq, "closing", timeout_s=TIMEOUT_S)
    letter = DeadLetter(None, b"not json", "decode", "not JSON", source, 0, 0)
    assert send_in_time(sink, letter, source) is None  # transactions initialised, metadata known

    own_kafka.stop()
    # A reason no UTF-8 holds (a lone surrogate) fails the send with an error of no Kafka
    # kind, after the letter before it went into the transaction: the transaction stays open.
    sent, unencodable = (
        DeadLetter(None, b"not json", "decode", reason, source, 0, i)
        for i, reason in ((1, "not JSON"), (2, "not JSON \udc80"))
    )
    with pytest.raises(UnicodeEncodeError):
        sink.send([sent, unencodable], {TopicPartition(source, 0): 3}, "letters")

    closing = threading.Thread(target=sink.close, daemon=True)
    started = time.monotonic()
    closing.start()
    # The abort, then the I/O thread's end: each waits at most TIMEOUT_S. Unbounded, close()
    # waited for the open transaction's letter until the broker came back.
    closing.join(2 * TIMEOUT_S + 10)
    waited = time.monotonic() - started
    assert not closing.is_alive(), f"sink.close still waiting after {waited:.0f}s"
    assert not [t for t in threading.enumerate() if t.name == "closing-dlq-network-thread"]
    assert "closed with 2 letter(s) not committed, from events/0@1 on" in caplog.text
    gc.collect()  # as above
