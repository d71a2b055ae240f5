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
        """A user out of credit was flushed under this budget policy."""


class IndexObserver(Protocol):
    def indexed(self, embedded: int, cost_micro_usd: int) -> None:
        """Fact versions written to the vector index, and the embedding cost booked."""

    def index_failed(self, facts: int) -> None:
        """An index write failed; the facts stay pending for the drain."""

    def pending(self, facts: int) -> None:
        """How many facts the vector index has not got yet."""
