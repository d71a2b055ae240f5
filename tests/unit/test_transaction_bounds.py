"""`bounded`: a step of a kafka-python transaction awaited at most so long.

The sink's integration test (tests/integration/test_dead_letter_timeouts.py) stops its broker
before the letters are acknowledged, so the acknowledgement and the abort time out there; a
coordinator lost between the acknowledgement and the commit cannot be timed with a real broker.
This checks the commit's wait at its seam, on kafka-python's own result type, so an upgrade
that changes how that result waits fails here.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from kafka.errors import KafkaTimeoutError, ProducerFencedError
from kafka.producer.transaction_manager import TransactionalRequestResult

from consumers.dead_letter import bounded


class Producer:
    """What `bounded` reads of a KafkaProducer: its transaction manager and its sender."""

    def __init__(self, result: TransactionalRequestResult) -> None:
        self._transaction_manager = self
        self._sender = self
        self.result, self.woken = result, 0

    def begin_commit(self) -> TransactionalRequestResult:
        return self.result

    def wakeup(self) -> None:
        self.woken += 1


def commit(producer: Any, timeout_s: float) -> None:
    bounded(lambda t: t.begin_commit(), producer, timeout_s)


def test_a_commit_the_coordinator_never_answers_times_out() -> None:
    producer = Producer(TransactionalRequestResult())
    started = time.monotonic()
    with pytest.raises(KafkaTimeoutError, match="transaction coordinator"):
        commit(producer, 0.2)
    assert 0.2 <= time.monotonic() - started < 2.0
    assert producer.woken == 1  # the I/O thread was told there is a request to send


def test_an_answered_commit_returns_or_raises_its_error() -> None:
    done = TransactionalRequestResult()
    done.done()
    commit(Producer(done), 0.2)
    fenced = TransactionalRequestResult()
    fenced.done(ProducerFencedError("fenced"))
    with pytest.raises(ProducerFencedError):
        commit(Producer(fenced), 0.2)
