"""A consumer riding out an outage: bounded backoff, and saying so while it lasts.

An outage is a dependency that is away for a while (Postgres, the broker, the dead-letter
topic, a database that refuses writes until an operator acts, the LLM provider failing every
memory's flush or refusing memoryd's key: `consumers.backend_outage`): the work is not at
fault, so it is retried, without a cap on the number of attempts, each wait bounded by the one
retry policy (`domain.retry.Backoff`). While it lasts the process is degraded: a warning per retry
in the log, `memoryd_consumer_degraded{consumer}` at 1 and a count of retries by cause. Each
source (what failed: a poll, a flush, dead letters) recovers on its own success, which logs
it; the gauge goes back to 0 once none is failing. Nothing needs a restart.

A source may be one memory's (a flush of it, recording its failed run): a failure that hits
one memory only (a lock or statement timeout on its rows) backs off on its own and keeps the
consumer degraded for as long as it lasts, however many other memories flush meanwhile. A
whole database away fails every memory, and each recovers on its own success once it is back.

A flush of a memory being erased is waited out the same way and counted with cause
`erasure`, but does not make the process degraded: no dependency is away, and an erasure
that does not end is what `MemorydErasureStuck` watches.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from kafka.errors import KafkaError

from consumers.errors import DeadLetterError
from consumers.metrics import PipelineMetrics
from domain.ids import MemoryKey
from domain.retry import Backoff
from processors.errors import CredentialsRefused, TransientBackendError
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


# Waiting for an erasure is routine (seconds; a minute or two for one the API accepted while
# a flush held its memory, until the processors' resumption takes it) and no dependency is
# away: counted, but the consumer is not degraded. One that does not end is
# MemorydErasureStuck's.
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
    if isinstance(error, CredentialsRefused):  # before its base: "fix the key", not "wait"
        return "backend_auth"
    if isinstance(error, TransientBackendError):
        return "backend"
    return "broker"


# What failed, and the memory it failed for (None: the consumer's own, e.g. a poll).
Source = tuple[str, MemoryKey | None]


class Outage:
    """One consumer's outages, kept per source: what failed (a poll, a flush, dead letters),
    for which memory if it is one memory's, and why. A source that succeeds recovers itself
    only: the dead-letter topic away is not over because a flush committed, nor one memory's
    flush because another's did, and their retries do not start again at the base backoff.
    The consumer stays degraded while any source is failing."""

    def __init__(
        self, consumer: str, metrics: PipelineMetrics, backoff: Backoff = DEFAULT_BACKOFF
    ) -> None:
        self._consumer = consumer
        self._metrics = metrics
        self._backoff = backoff
        self._lock = threading.Lock()  # a rebalance callback may recover from the IO thread
        self._failing: dict[tuple[Source, str], int] = {}  # (source, cause) -> retries
        metrics.degraded.labels(consumer).set(0)

    @property
    def failures(self) -> int:
        """Retries since each failing source last succeeded (0: healthy)."""
        with self._lock:
            return sum(self._failing.values())

    def failed(
        self,
        error: BaseException,
        what: str,
        memory: MemoryKey | None = None,
        at_least: float = 0.0,
    ) -> float:
        """Count a failure of `what` (for `memory`); returns how long to wait before trying
        it again: the backoff's, or `at_least` if longer (what the dependency asked for)."""
        cause = cause_of(error)
        key = ((what, memory), cause)
        with self._lock:
            retries = self._failing.get(key, 0)
            self._failing[key] = retries + 1
            self._publish()
        wait = max(self._backoff.delay(retries), at_least)
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
            extra={**self._fields(memory), "cause": cause, "retry_in_s": wait},
        )
        return wait

    def recovered(self, what: str, memory: MemoryKey | None = None) -> None:
        """`what` (for `memory`) succeeded, or nothing waits on it any more."""
        self._end(lambda source: source == (what, memory), what, memory)

    def recovered_everywhere(self, what: str) -> None:
        """Nothing waits on `what` any more, for any memory (their work went elsewhere)."""
        self._end(lambda source: source[0] == what, what, None)

    def _end(self, ends: Callable[[Source], bool], what: str, memory: MemoryKey | None) -> None:
        with self._lock:
            ended = {k: n for k, n in self._failing.items() if ends(k[0])}
            if not ended:
                return
            for key in ended:
                del self._failing[key]
            self._publish()
        log.info(
            "%s recovered after %d retries",
            what,
            sum(ended.values()),
            extra=self._fields(memory),
        )

    def _fields(self, memory: MemoryKey | None) -> dict[str, object]:
        if memory is None:
            return {"consumer": self._consumer}
        ids = {"organization_id": memory.organization_id, "user_id": memory.user_id}
        return {"consumer": self._consumer, **ids}

    def _publish(self) -> None:
        degraded = any(cause not in NOT_DEGRADING for _, cause in self._failing)
        self._metrics.degraded.labels(self._consumer).set(1 if degraded else 0)
