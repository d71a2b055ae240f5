"""A consumer riding out an outage: bounded backoff, and saying so while it lasts.

An outage is a dependency that is away for a while (Postgres, the broker, the dead-letter
topic, a database that refuses writes until an operator acts): the work is not at fault, so
it is retried, without a cap on the number of attempts, each wait bounded by the one retry
policy (`domain.retry.Backoff`). While it lasts the process is degraded: a warning per retry
in the log, `memoryd_consumer_degraded{consumer}` at 1 and a count of retries by cause; the
first success logs the recovery and puts the gauge back to 0. Nothing needs a restart.

A flush of a memory being erased is waited out the same way and counted with cause
`erasure`, but does not make the process degraded: no dependency is away, and an erasure
that does not end is what `MemorydErasureStuck` watches.
"""

from __future__ import annotations

import logging

from kafka.errors import KafkaError

from consumers.errors import DeadLetterError
from consumers.metrics import PipelineMetrics
from domain.retry import Backoff
from store.errors import DatabaseRefused, DatabaseUnavailable, MemoryBeingErased, StoreError

log = logging.getLogger(__name__)

# Postgres away, the broker away, the dead-letter topic unwritable, a write refused (e.g. a
# privilege revoked, a disk full): a consumer retries all of them the same way.
OUTAGES: tuple[type[Exception], ...] = (StoreError, DeadLetterError, KafkaError)
DEFAULT_BACKOFF = Backoff(base_s=0.5, max_s=30.0)


# Waiting for an erasure is routine (it takes seconds) and no dependency is away: counted,
# but the consumer is not degraded. One that does not end is MemorydErasureStuck's.
NOT_DEGRADING = frozenset({"erasure"})


def cause_of(error: BaseException) -> str:
    """A low-cardinality label for what is away."""
    if isinstance(error, MemoryBeingErased):
        return "erasure"
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
    def __init__(
        self, consumer: str, metrics: PipelineMetrics, backoff: Backoff = DEFAULT_BACKOFF
    ) -> None:
        self._consumer = consumer
        self._metrics = metrics
        self._backoff = backoff
        self._failures = 0
        metrics.degraded.labels(consumer).set(0)

    @property
    def failures(self) -> int:
        """Retries since the last success (0: healthy)."""
        return self._failures

    def failed(self, error: BaseException, what: str) -> float:
        """Count a failure of `what`; returns how long to wait before trying again."""
        cause = cause_of(error)
        wait = self._backoff.delay(self._failures)
        self._failures += 1
        degrading = cause not in NOT_DEGRADING
        if degrading:
            self._metrics.degraded.labels(self._consumer).set(1)
        self._metrics.outage_retries.labels(self._consumer, cause).inc()
        log.log(
            logging.WARNING if degrading else logging.INFO,
            "%s (%s): %s failed, retry %d in %.1fs: %s",
            "degraded" if degrading else "waiting",
            cause,
            what,
            self._failures,
            wait,
            error,
            extra={"consumer": self._consumer, "cause": cause},
        )
        return wait

    def recovered(self) -> None:
        if self._failures:
            log.info(
                "recovered after %d retries",
                self._failures,
                extra={"consumer": self._consumer},
            )
            self._failures = 0
            self._metrics.degraded.labels(self._consumer).set(0)
