"""What a memory's flush comes back with, for `consumers.settlement` to settle the batch by:
how it ended, the runs it wrote, and the events it gives up on."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from consumers.batching import Rejection
from consumers.splitting import Consolidated
from domain.model import MemoryUpdate
from processors.errors import BackendFailure
from producers.contract import ContextEvent


class FlushKind(StrEnum):
    CONSOLIDATED = "consolidated"
    NOTHING_NEW = "nothing_new"
    DEFERRED = "deferred"
    REJECTED = "rejected"  # the backend could answer none of the events usably
    # Every event was of an erased memory before its tombstone, or redacted by a fact erasure.
    FORGOTTEN = "forgotten"


@dataclass(frozen=True)
class RejectedEvents:
    """Events to dead-letter after a split; their failed runs are recorded already."""

    event_ids: tuple[uuid.UUID, ...]
    reason: str


@dataclass(frozen=True)
class FlushResult:
    kind: FlushKind
    events: int  # consolidated (or deferred) by this flush
    updates: tuple[MemoryUpdate, ...] = ()
    reason: str = ""
    skip_embeddings: bool = False
    rejected: tuple[RejectedEvents, ...] = ()
    deferred_run: uuid.UUID | None = None
    deferred: tuple[uuid.UUID, ...] = ()  # the events the deferred run parks
    forgotten: int = 0  # events left out because an erasure forgot them

    @classmethod
    def bisected(
        cls,
        size: int,
        updates: Sequence[MemoryUpdate],
        found: Consolidated[ContextEvent, MemoryUpdate],
        *,
        skip_embeddings: bool,
    ) -> FlushResult:
        """A batch of `size` events bisected: the runs applied, the events it gives up on."""
        rejected = [
            RejectedEvents(
                tuple(e.event_id for e in group),
                f"backend error: {why} (bisected out of a batch of {size})",
            )
            for group, why in found.failing
        ]
        rejected.extend(
            RejectedEvents(tuple(x.event_id for x in group), f"backend error: {why}")
            for group, why in found.unanswered
        )
        return cls(
            FlushKind.CONSOLIDATED if updates else FlushKind.REJECTED,
            sum(len(u.run.input_event_ids) for u in updates),
            tuple(updates),
            skip_embeddings=skip_embeddings,
            rejected=tuple(rejected),
        )

    @property
    def rejected_reasons(self) -> dict[uuid.UUID, str]:
        """Per event split off, why the backend could not answer it."""
        return {i: r.reason for r in self.rejected for i in r.event_ids}

    def split_rejection(self, count: int) -> Rejection:
        """The letter of the `count` events split off, each with its failure (runs recorded)."""
        summary = f"{count} event(s) the backend cannot answer usably, as in: "
        summary += self.rejected[0].reason
        # Split off for answers the model could not make usable (`UnusableAnswer`).
        unusable = BackendFailure.UNUSABLE_ANSWER
        return Rejection(
            "consolidate", summary, unusable, recorded=True, reasons=self.rejected_reasons
        )

    @property
    def run_ids(self) -> tuple[uuid.UUID, ...]:
        """The runs this flush wrote: the applied ones, or the deferred one."""
        applied = tuple(u.run.run_id for u in self.updates)
        return applied if self.deferred_run is None else (*applied, self.deferred_run)
