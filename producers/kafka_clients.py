"""kafka-python clients made so that a constructor that fails leaves nothing open behind it.

kafka-python 3.0.12's KafkaConsumer and KafkaAdminClient start their network client (an I/O
thread, its selector, a wake-up socket pair) and only then reach for a broker. When none answers,
the constructor raises and nothing ever closes that client: a thread and four descriptors stay
behind for each attempt, for as long as the process lives (a health check tries every few
seconds while Kafka is down). KafkaProducer's leaves its selector to the garbage collector.

Each of the three makes its network client with the factory of its `kafka_client` setting, so
open_client() passes one that keeps what it made, and closes that if the constructor raises.

And what the producer does not tell: that it failed for good, and which of its records were
aborted rather than refused; and how to drop it without waiting on its broker.
"""

from __future__ import annotations

import contextlib
from typing import Any

from kafka.errors import KafkaError


def open_client(client_class: Any, **configs: Any) -> Any:
    """client_class(**configs), for KafkaConsumer, KafkaProducer or KafkaAdminClient; if that
    raises, the network client it had made is closed before the error goes on to the caller."""
    make_network = configs.pop("kafka_client", client_class.DEFAULT_CONFIG["kafka_client"])
    made: list[Any] = []

    def network_client(**network_configs: Any) -> Any:
        made.append(make_network(**network_configs))
        return made[-1]

    try:
        return client_class(kafka_client=network_client, **configs)
    except BaseException:
        for network in made:
            # The constructor's own error is what the caller must see; a client that never
            # reached a broker has nothing to flush, so a failure to close it changes nothing.
            with contextlib.suppress(KafkaError, OSError):
                network.close()
        raise


# kafka-python 3.0.12 tells neither that a producer is done for nor which of its records were
# caught up in that, and offers no bounded way to drop a producer whose broker is away: the
# functions below read the producer's private parts, here alone. Check them on any upgrade.


def has_failed_for_good(producer: Any) -> bool:
    """Whether `producer` fails every record from now on.

    kafka-python 3.0.12's idempotent producer takes a record the broker refuses for what it is
    (too large for the topic, an authorization error, an invalid record) as fatal to its
    transaction manager: from then on its I/O thread aborts every record sent, until the
    process ends. Only a new producer sends again."""
    manager = producer._transaction_manager
    return manager is not None and bool(manager.has_error())


def was_aborted(future: Any) -> bool:
    """Whether a failed send's record was aborted by its producer, not refused by the broker.

    An aborted record was caught up in another record's failure (or in a forced close) and may
    be sent again. kafka-python resolves an aborted batch with base offset -1, a batch the
    broker refused with None: the offset is read from the future's batch result."""
    result = future._produce_future.value
    return result is not None and result[0] == -1


def unanswered(producer: Any) -> int:
    """How many records `producer` holds that neither the broker nor a timeout answered yet."""
    held: int = sum(batch.record_count for batch in producer._accumulator._incomplete.all())
    return held


def close_now(producer: Any, timeout_s: float) -> None:
    """Close `producer` without waiting for its broker; the records it still holds fail.

    kafka-python 3.0.12's `close(timeout=0)` flushes first and raises KafkaTimeoutError while a
    record is unanswered (the broker away), before it stops the I/O thread: thread and sockets
    stayed, one set per failed attempt. Its `close()` waits for those records with no limit,
    and some never expire: an idempotent producer whose broker stopped answering resets its
    producer id and sends nothing, nor expires anything, until the broker answers again.
    Forced to close, the thread fails those records and ends (within `timeout_s`), then
    `close` finds nothing to wait for."""
    producer._sender.force_close()
    producer._sender.join(timeout_s)
    producer.close(timeout=0)
