"""KafkaEventPublisher over a stand-in producer: every send before the one wait, and which
events of a batch were not acknowledged, and why."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from kafka.errors import KafkaTimeoutError, MessageSizeTooLargeError, NotEnoughReplicasError

from producers.contract import ContextEvent
from producers.errors import PublishError, Undelivered
from producers.publisher import KafkaEventPublisher, ProducerSettings
from tests.support.builders import make_event

SETTINGS = ProducerSettings("localhost:9092", "events", delivery_timeout_ms=2_000)


class Future:
    def __init__(self, calls: list[str], position: int, error: Exception | None) -> None:
        self._calls, self._position, self._error = calls, position, error

    def get(self, timeout: float) -> object:
        assert 0 <= timeout <= SETTINGS.delivery_timeout_ms / 1000
        self._calls.append(f"get {self._position}")
        if self._error is not None:
            raise self._error
        return object()


class Producer:
    """Records the calls; `on_send` and `on_ack` say which positions fail where, and how."""

    # kafka-python's, None when idempotence is off: a producer that never fails for good.
    _transaction_manager = None

    def __init__(
        self,
        on_send: dict[int, Exception] | None = None,
        on_ack: dict[int, Exception] | None = None,
    ) -> None:
        self.calls: list[str] = []
        self._on_send, self._on_ack = on_send or {}, on_ack or {}
        self._sent = 0

    def send(self, topic: str, **_record: Any) -> Future:
        position = self._sent
        self._sent += 1
        self.calls.append(f"send {position}")
        if position in self._on_send:
            raise self._on_send[position]
        return Future(self.calls, position, self._on_ack.get(position))

    def flush(self, timeout: float) -> None:
        self.calls.append("flush")


def events(n: int) -> list[ContextEvent]:
    return [make_event(f"user-{i % 3}", f"event {i}") for i in range(n)]


def publish(producer: Producer, batch: list[ContextEvent]) -> tuple[Undelivered, ...]:
    publisher = KafkaEventPublisher(SETTINGS, open_producer=lambda _: producer)
    try:
        publisher.publish(batch)
    except PublishError as e:
        return e.undelivered
    return ()


def test_every_event_is_sent_before_the_first_wait_and_the_wait_is_one() -> None:
    producer = Producer()
    assert publish(producer, events(100)) == ()
    sends = [c for c in producer.calls if c.startswith("send")]
    waits = [i for i, c in enumerate(producer.calls) if not c.startswith("send")]
    assert sends == [f"send {i}" for i in range(100)]
    assert min(waits) == 100  # no wait between two sends: one round trip, not one per event
    assert producer.calls.count("flush") == 1


def test_a_batch_names_the_events_not_acknowledged_and_whether_to_send_them_again() -> None:
    producer = Producer(
        on_send={3: MessageSizeTooLargeError("over max_request_size")},
        on_ack={1: MessageSizeTooLargeError("refused"), 5: NotEnoughReplicasError("isr")},
    )
    undelivered = publish(producer, events(8))
    assert [(u.position, u.retriable) for u in undelivered] == [(1, False), (3, False), (5, True)]
    assert "MessageSizeTooLargeError" in undelivered[0].reason
    # The events after the one the client refused were sent all the same, and waited for.
    assert [c for c in producer.calls if c.startswith("send")] == [f"send {i}" for i in range(8)]
    assert [c for c in producer.calls if c.startswith("get")] == [
        f"get {i}" for i in range(8) if i != 3
    ]


def test_a_send_that_found_no_broker_in_time_is_not_tried_again_for_the_rest() -> None:
    producer = Producer(on_send={2: KafkaTimeoutError("no metadata in max_block_ms")})
    undelivered = publish(producer, events(6))
    assert [(u.position, u.retriable) for u in undelivered] == [(p, True) for p in range(2, 6)]
    assert [c for c in producer.calls if c.startswith("send")] == ["send 0", "send 1", "send 2"]
    assert [c for c in producer.calls if c.startswith("get")] == ["get 0", "get 1"]


def test_a_wait_past_the_timeout_leaves_the_unanswered_events_retriable() -> None:
    producer = Producer(on_ack={0: KafkaTimeoutError("Timeout after waiting")})
    assert [(u.position, u.retriable) for u in publish(producer, events(2))] == [(0, True)]


@pytest.mark.parametrize("n", [1, 500])
def test_all_acknowledged_raises_nothing(n: int) -> None:
    assert publish(Producer(), events(n)) == ()


class FailedManager:
    """kafka-python's transaction manager of a producer that failed for good."""

    @staticmethod
    def has_error() -> bool:
        return True


class Sender:
    def __init__(self, calls: list[str]) -> None:
        self._calls = calls

    def force_close(self) -> None:
        self._calls.append("force_close")

    def join(self, timeout: float) -> None:
        self._calls.append("join")


class FailedProducer(Producer):
    _transaction_manager = FailedManager()

    def __init__(self) -> None:
        super().__init__()
        self._sender = Sender(self.calls)

    def close(self, timeout: float) -> None:
        self.calls.append(f"close {timeout}")


def test_a_producer_failed_for_good_is_closed_at_once_and_replaced_when_a_new_one_opens() -> None:
    failed, working = FailedProducer(), Producer()
    opened: list[Producer | Exception] = [failed, KafkaTimeoutError("no broker"), working]

    def open_producer(_settings: ProducerSettings) -> Producer:
        made = opened.pop(0)
        if isinstance(made, Exception):
            raise made
        return made

    publisher = KafkaEventPublisher(SETTINGS, open_producer=open_producer)
    with pytest.raises(PublishError) as no_new_one:
        publisher.publish(events(2))
    # Nothing was sent, and no event named: the caller may send them all again.
    assert (failed.calls, no_new_one.value.undelivered) == ([], ())

    publisher.publish(events(2))  # the next request tries again, and a new producer opens
    assert failed.calls == ["force_close", "join", "close 0"]
    assert [c for c in working.calls if c.startswith("send")] == ["send 0", "send 1"]


class Incomplete:
    @staticmethod
    def all() -> list[object]:
        return []  # every record answered


class Accumulator:
    _incomplete = Incomplete()


class ClosingProducer(FailedProducer):
    """A producer whose records were all answered, closed as `close` closes one."""

    _transaction_manager = None
    _accumulator = Accumulator()


def test_a_close_with_nothing_held_says_so_once_and_a_second_close_does_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="producers.publisher")
    producer = ClosingProducer()
    publisher = KafkaEventPublisher(SETTINGS, open_producer=lambda _: producer)

    publisher.close()
    assert producer.calls == ["flush", "force_close", "join", "close 0"]
    # The API closes it in the server's graceful stop, then again after the server on SIGINT.
    publisher.close()
    assert producer.calls == ["flush", "force_close", "join", "close 0"]
    assert caplog.messages == ["Kafka producer closed with no record unacknowledged"]
