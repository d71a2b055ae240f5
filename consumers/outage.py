"""A consumer riding out an outage: bounded backoff, and saying so while it lasts.

An outage is a dependency that is away for a while (Postgres, the broker, the dead-letter
topic, a database that refuses writes until an operator acts): the work is not at fault, so
it is retried, without a cap on the number of attempts, each wait bounded by the one retry
policy (`domain.retry.Backoff`). While it lasts the process is degraded: a warning per retry
in the log, `memoryd_consumer_degraded{consumer}` at 1 and a count of retries by cause. Each
source (what failed: a poll, a flush, dead letters) recovers on its own success, which logs
it; the gauge goes back to 0 once none is failing. Nothing needs a restart.

A flush of a memory being erased is waited out the same way and counted with cause
`erasure`, but does not make the process degraded: no dependency is away, and an erasure
that does not end is what `MemorydErasureStuck` watches.
"""

from __future__ import annotations

import logging
import threading

from kafka.errors import KafkaError

from consumers.errors import DeadLetterError
from consumers.metrics import PipelineMetrics
from domain.retry import Backoff
from store.errors import (
    DatabaseRefused,
    DatabaseUnavailable,
    MemoryBeingErased,
    MemoryBusy,
    StoreError,
)

log = logging.getLogger(__name__)

# Postgres away, the broker away, the dead-letter topic unwritable, a write refused (e.g. a
# privilege revoked, a disk full): a consumer retries all of them the same way.
OUTAGES: tuple[type[Exception], ...] = (StoreError, DeadLetterError, KafkaError)
DEFAULT_BACKOFF = Backoff(base_s=0.5, max_s=30.0)


# Waiting for an erasure is routine (it takes seconds) and no dependency is away: counted,
# but the consumer is not degraded. One that does not end is MemorydErasureStuck's.
NOT_DEGRADING = frozenset({"erasure", "memory_busy"})


def cause_of(error: BaseException) -> str:
    """A low-cardinality label for what is away."""
    if isinstance(error, MemoryBeingErased):
        return "erasure"
    if isinstance(error, MemoryBusy):  # the give-up path does not wait for a memory's lock
        return "memory_busy"
    if isinstance(error, DatabaseRefused) or (
        isinstance(error, StoreError) and not isinstance(error, DatabaseUnavailable)
    ):
        return "database_refused"
    if isinstance(error, DatabaseUnavailable):
        return "database"
    if isinstance(error, DeadLetterError):
        return "dead_letter_topic"
    return "broker"


class Outage:
    """One consumer's outages, kept per source: what failed (a poll, a flush, dead letters)
    and why. A source that succeeds recovers itself only: the dead-letter topic away is not
    over because a flush committed, and its retries do not start again at the base backoff.
    The consumer stays degraded while any source is failing."""

    def __init__(
        self, consumer: str, metrics: PipelineMetrics, backoff: Backoff = DEFAULT_BACKOFF
    ) -> None:
        self._consumer = consumer
        self._metrics = metrics
        self._backoff = backoff
        self._lock = threading.Lock()  # a rebalance callback may recover from the IO thread
        self._failing: dict[tuple[str, str], int] = {}  # (what, cause) -> retries
        metrics.degraded.labels(consumer).set(0)

    @property
    def failures(self) -> int:
        """Retries since each failing source last succeeded (0: healthy)."""
        with self._lock:
            return sum(self._failing.values())

    def failed(self, error: BaseException, what: str) -> float:
        """Count a failure of `what`; returns how long to wait before trying it again."""
        cause = cause_of(error)
        with self._lock:
            retries = self._failing.get((what, cause), 0)
            self._failing[(what, cause)] = retries + 1
            self._publish()
        wait = self._backoff.delay(retries)
        degrading = cause not in NOT_DEGRADING
        self._metrics.outage_retries.labels(self._consumer, cause).inc()
        log.log(
            logging.WARNING if degrading else logging.INFO,
            "%s (%s): %s failed, retry %d in %.1fs: %s",
            "degraded" if degrading else "waiting",
            cause,
            what,
            retries + 1,
            wait,
            error,
            extra={"consumer": self._consumer, "cause": cause},
        )
        return wait

    def recovered(self, what: str) -> None:
        """`what` succeeded, or nothing waits on it any more."""
        with self._lock:
            ended = {k: n for k, n in self._failing.items() if k[0] == what}
            if not ended:
                return
            for key in ended:
                del self._failing[key]
            self._publish()
        log.info(
            "%s recovered after %d retries",
            what,
            sum(ended.values()),
            extra={"consumer": self._consumer},
        )

    def _publish(self) -> None:
        degraded = any(cause not in NOT_DEGRADING for _, cause in self._failing)
        self._metrics.degraded.labels(self._consumer).set(1 if degraded else 0)
