"""How one memory's batch is retried after a transient backend failure, by the live flush
(`consumers.settlement`) and by a shadow replay alike.

One memory failing alone is never a backend outage (`consumers.backend_outage`): each failure
is charged an attempt, the retry waits at least as long as the provider asked (a quota's
RetryInfo, a Retry-After header) up to `backend_retry_max_s`, and at least the backoff, and the
batch is given up after `max_attempts` (dead-lettered live; failed in a replay). So a replay
gives up a batch only where a live flush would have, and neither spends its attempts on more
429s before the quota the provider named has reset.

A refusal of the credentials is never retried: it is about the key, not the batch (live, an
outage at once; a replay stops: `shadow_consolidate`).
"""

from __future__ import annotations

from dataclasses import dataclass

from consumers.settings import ProcessorSettings
from domain.retry import Backoff
from processors.errors import TransientBackendError


@dataclass(frozen=True)
class BatchRetry:
    attempts: int  # calls of one request, the first included
    backoff: Backoff  # the least wait before a retry
    asked_max_s: float  # the longest wait a provider's own retry delay is honoured for

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        if self.asked_max_s <= 0:
            raise ValueError(f"asked_max_s must be > 0, got {self.asked_max_s}")

    @classmethod
    def of(cls, settings: ProcessorSettings) -> BatchRetry:
        """The retry of a batch, from the processor's settings."""
        return cls(settings.max_attempts, settings.backoff, settings.backend_retry_max_s)

    def delay(self, retry: int, error: TransientBackendError) -> float:
        """Seconds to wait before retry `retry` (0: the first) after `error`."""
        return max(self.backoff.delay(retry), self.asked(error))

    def asked(self, error: TransientBackendError) -> float:
        """The provider's own retry delay, up to the cap (0: it named none)."""
        return min(error.retry_after_s or 0.0, self.asked_max_s)


# The processor's defaults: what a replay does when nothing says otherwise.
LIVE_DEFAULTS = BatchRetry.of(ProcessorSettings())
