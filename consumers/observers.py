"""What the flush and index paths report, as Protocols: the logic calls these, and
`consumers.metrics.PipelineMetrics` turns the calls into Prometheus metrics."""

from __future__ import annotations

from typing import Protocol

from domain.model import RunRecord


class FlushObserver(Protocol):
    def flushed(self, backend: str, seconds: float) -> None:
        """One user's flush finished (whatever its outcome), taking this long."""

    def consolidated(self, run: RunRecord) -> None:
        """A run's effect was committed: its events, tokens, cost and gate verdicts."""

    def budget_applied(self, policy: str) -> None:
        """A user out of credit was flushed under this budget policy: once per flush that
        ended, not once per try of it (a backend retry, a re-plan, an outage)."""

    def charged(self, run: RunRecord) -> None:
        """A run that changed nothing (failed, deferred, discarded) was recorded: its tokens
        and cost, booked all the same."""

    def probed(self, *, usable: bool) -> None:
        """A backend call bisecting a batch the model could not answer was answered."""


class IndexObserver(Protocol):
    def indexed(self, embedded: int, cost_micro_usd: int) -> None:
        """Fact versions written to the vector index, and the embedding cost booked."""

    def index_failed(self, facts: int) -> None:
        """An index write failed; the facts stay pending for the drain."""

    def index_write_held(self, released_by: str) -> None:
        """An index write waited for the flushes (`consumers.foreground`) until a flush waited
        on its backend (`backend_wait`), for its whole bound (`bound`), or until the queue
        closed (`cancelled`)."""

    def pending(self, facts: int, oldest_s: float) -> None:
        """How many facts the vector index has not got yet, and how long the oldest of them
        has waited (since its change; 0 when none waits)."""
