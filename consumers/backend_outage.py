"""Whether the backend is out, rather than a batch at fault: the rule that tells a provider
outage from a poison batch, as a pure state machine of the flushes' outcomes.

A transient failure (429, 5xx, a timeout) says nothing by itself of whose fault it is. A batch
the provider cannot serve fails on its own while other memories' flushes get answers; a provider
away (a quota spent, an overloaded region) fails every memory. So the backend is *out* once the
last `after` flushes that asked it all failed transiently and were not all one memory's, and it
is back on the first answer (usable or not, its write refused or not: the provider answered).
While it is out, a failing batch waits like through a database outage and is charged no
attempt; else it is charged one, and after its last one it is dead-lettered, so a poison batch
never holds its partition.

A refusal of memoryd's credentials (`CredentialsRefused`: a key revoked or expired, the API
disabled for its project) is an outage at once, even for one memory: it is about the key, never
the batch, so no poison batch can look like it, and it ends like the others on the first answer.

One memory failing transiently alone is never an outage, however often: a lone poison batch,
with nothing else to flush, would otherwise wait forever. The price: with a single memory to
consolidate, a provider away dead-letters it after its attempts (each waiting as long as the
provider asked).

Kept on the processor's polling thread, where batches are settled: no lock.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from domain.ids import MemoryKey


class BackendOutage:
    """`max_s` bounds an outage told by the streak: two batches the provider cannot serve,
    with nothing else to flush, fail like a provider away, and must not hold their partitions
    for good; past it their attempts are charged again. A refusal of the credentials is not
    bounded: it is never a batch's fault, and an operator's fix ends it."""

    def __init__(
        self,
        after: int,
        max_s: float = math.inf,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if after < 2:
            raise ValueError(f"an outage needs at least 2 failures in a row, got {after}")
        self._after = after
        self._max_s = max_s
        self._clock = clock
        self._streak = 0  # flushes in a row that failed transiently
        self._first: MemoryKey | None = None  # the streak's first memory
        self._several = False  # the streak holds another memory's failure too
        self._since: float | None = None  # when the streak made the backend out
        self._refused = False  # the credentials were refused, and nothing else came since

    @property
    def out(self) -> bool:
        if self._refused:
            return True
        if self._since is None:
            return False
        return self._clock() - self._since <= self._max_s

    def refused(self) -> None:
        """A flush was refused for memoryd's credentials: the backend is out until it answers
        or fails otherwise."""
        self._refused = True

    def failed(self, key: MemoryKey) -> bool:
        """A flush of `key` failed transiently; returns whether the backend is out now.

        A failure other than a refusal ends a refusal's outage: the credentials passed, or
        the provider says something else now. Else a poison batch failing alone after one
        passing refusal would wait as the backend out for good."""
        self._refused = False
        self._streak += 1
        if self._first is None:
            self._first = key
        elif key != self._first:
            self._several = True
        if self._since is None and self._streak >= self._after and self._several:
            self._since = self._clock()
        return self.out

    def answered(self) -> bool:
        """A flush got the backend's answer; returns whether that ended an outage."""
        was_out = self.out
        self._streak, self._first, self._several, self._since = 0, None, False, None
        self._refused = False
        return was_out
