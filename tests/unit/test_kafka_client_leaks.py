"""A Kafka client that meets no broker leaves no thread and no descriptor behind.

kafka-python's constructors start a network client before they look for a broker, and raise
when none answers; what they started is ours to close (producers.kafka_clients). The clients
here are real, pointed at a port where nothing listens: the paths that run while a service is
up (a forget reading end offsets, the health checks' admin client) and each client class.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.errors import KafkaError

from consumers.errors import ConsumerError
from consumers.kafka_client import end_offsets
from consumers.lag import KafkaUnavailable
from memoryd.dev import free_port
from memoryd.ops.runtime import kafka_admin
from producers.kafka_clients import open_client
from tests.support.deployment import deployment_settings

# kafka-python's own: a socket whose connection was refused is dropped unclosed (kafka.net.inet),
# and the collector closes it with this warning. Not ours to close; what is ours is counted below.
pytestmark = pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning")
ATTEMPTS = 3


@pytest.fixture(autouse=True)
def kafka_logs_unkept(caplog: pytest.LogCaptureFixture) -> None:
    """Records of kafka-python's refused connections keep their tracebacks, and with them the
    sockets above: captured, they would be counted as left open."""
    caplog.set_level(logging.CRITICAL, logger="kafka")


@pytest.fixture
def no_broker() -> str:
    return f"127.0.0.1:{free_port()}"  # picked, never bound: every connection is refused


def _open() -> tuple[set[str], set[threading.Thread]]:
    """The descriptors and live threads of this process, once the garbage collector has run."""
    gc.collect()
    return set(os.listdir("/proc/self/fd")), set(threading.enumerate())


@contextmanager
def nothing_left_open() -> Iterator[None]:
    """What the block opened is closed again. Compared as sets, not counts: threads and
    descriptors of earlier tests may still be winding down meanwhile (a loaded machine lets
    them linger), and what they close is not this block's to count."""
    fds, threads = _open()
    yield
    fds_after, threads_after = _open()
    assert (fds_after - fds, threads_after - threads) == (set(), set()), "left open"


def _fails(attempt: Callable[[], object], error: type[BaseException]) -> None:
    with nothing_left_open():
        for _ in range(ATTEMPTS):
            with pytest.raises(error):
                attempt()


def test_end_offsets_of_a_forget_that_meets_no_broker(no_broker: str) -> None:
    _fails(lambda: end_offsets(no_broker, "events", timeout_s=1.0), ConsumerError)


def test_health_checks_that_meet_no_broker(no_broker: str, tmp_path: Path) -> None:
    settings = deployment_settings(no_broker, "postgresql://nowhere", "events", "dlq", tmp_path)
    settings = settings.model_copy(
        update={"ops": settings.ops.model_copy(update={"health_timeout_s": 1.0})}
    )
    admin = kafka_admin(settings)
    try:
        _fails(admin.ping, KafkaUnavailable)
    finally:
        admin.close()


@pytest.mark.parametrize("client_class", [KafkaConsumer, KafkaProducer, KafkaAdminClient])
def test_a_client_whose_constructor_meets_no_broker(client_class: Any, no_broker: str) -> None:
    _fails(
        lambda: open_client(client_class, bootstrap_servers=no_broker, bootstrap_timeout_ms=500),
        KafkaError,
    )
