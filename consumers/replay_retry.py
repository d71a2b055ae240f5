"""How a shadow replay retries a call that failed transiently: as a live flush retries a batch.

A replay consolidates one memory, and one memory failing alone is never a backend outage
(`consumers.backend_outage`): a live flush charges each failure an attempt, waits at least as
long as the provider asked (a quota's RetryInfo, a Retry-After header) up to
`backend_retry_max_s`, and at least its backoff, and gives the batch up after `max_attempts`
(`consumers.settlement`). A replay built from the same settings gives up a batch only where a
live flush would have dead-lettered it, and does not spend its attempts on more 429s before the
quota the provider named has reset.

A refusal of the credentials is never retried: it is about the key, not the batch, and no wait
of a command's length ends it (`shadow_consolidate` stops the replay).
"""

from __future__ import annotations

from dataclasses import dataclass

from consumers.settings import ProcessorSettings
from domain.retry import Backoff
from processors.errors import TransientBackendError


@dataclass(frozen=True)
class ShadowRetry:
    attempts: int  # calls of one request, the first included
    backoff: Backoff  # the least wait before a retry
    asked_max_s: float  # the longest wait a provider's own retry delay is honoured for

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        if self.asked_max_s <= 0:
            raise ValueError(f"asked_max_s must be > 0, got {self.asked_max_s}")

    @classmethod
    def of(cls, settings: ProcessorSettings) -> ShadowRetry:
        """The live flush's retry of a batch, from the processor's settings."""
        return cls(settings.max_attempts, settings.backoff, settings.backend_retry_max_s)

    def delay(self, retry: int, error: TransientBackendError) -> float:
        """Seconds to wait before retry `retry` (0: the first) after `error`."""
        asked = min(error.retry_after_s or 0.0, self.asked_max_s)
        return max(self.backoff.delay(retry), asked)


# The processor's defaults: what a replay does when nothing says otherwise.
LIVE_DEFAULTS = ShadowRetry.of(ProcessorSettings())
