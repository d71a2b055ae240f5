"""The one retry policy: bounded exponential backoff with jitter, as a pure function.

Every loop that retries (the processor's per-user batches, the log writer, the read path's
background writers, shadow replay) asks a `Backoff` how long to wait. Jitter spreads the
retries of many users or processes that failed together, so they do not all come back at once.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

# 2**64 times any base is past every cap; a larger exponent could overflow a float.
_MAX_EXPONENT = 64
# Its own generator: retries in background threads never move the global `random` state
# that seeded code (and hypothesis, which checks it) relies on.
_JITTER = random.Random()


@dataclass(frozen=True)
class Backoff:
    base_s: float
    max_s: float
    jitter: float = 0.2  # the wait is drawn from nominal × (1 ± jitter)

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.max_s:
            raise ValueError(f"need 0 < base_s <= max_s, got {self.base_s}, {self.max_s}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter}")

    def nominal(self, attempt: int) -> float:
        """base_s × 2^attempt, capped at max_s; attempt 0 is the first retry."""
        if attempt < 0:
            raise ValueError(f"attempt must be >= 0, got {attempt}")
        return min(self.max_s, self.base_s * 2.0 ** min(attempt, _MAX_EXPONENT))

    def delay(self, attempt: int, rand: Callable[[], float] = _JITTER.random) -> float:
        """Seconds to wait before retry `attempt`; `rand` returns a float in [0, 1)."""
        return self.nominal(attempt) * (1.0 + self.jitter * (2.0 * rand() - 1.0))
