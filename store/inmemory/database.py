"""The tables of one in-memory database, and the lock that makes each write a transaction."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

from domain.ids import MemoryKey
from domain.model import Fact, LedgerEntry, LoggedRun, MemoryState
from domain.ports import Clock
from domain.reads import ContextLogRow


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class InMemoryDatabase:
    """What Postgres holds for memoryd, as plain dicts. Every adapter method holds `lock` for
    its whole read or write, so each is atomic, as one Postgres transaction is."""

    clock: Clock = _utc_now  # the time a transaction commits (a run's `finished_at`)
    lock: threading.RLock = field(default_factory=threading.RLock)
    memory: dict[MemoryKey, MemoryState] = field(default_factory=dict)
    generations: dict[MemoryKey, uuid.UUID] = field(default_factory=dict)
    facts: dict[uuid.UUID, Fact] = field(default_factory=dict)
    # (memory, event) → run
    consolidated: dict[tuple[MemoryKey, uuid.UUID], uuid.UUID] = field(default_factory=dict)
    runs: dict[uuid.UUID, LoggedRun] = field(default_factory=dict)  # in log order
    ledger: dict[uuid.UUID, LedgerEntry] = field(default_factory=dict)
    credits: dict[MemoryKey, int] = field(default_factory=dict)
    connections: dict[tuple[MemoryKey, str], tuple[str, ...]] = field(default_factory=dict)
    context_logs: dict[uuid.UUID, ContextLogRow] = field(default_factory=dict)
    # An erased memory's cut-offs by subject digest, and the memories being erased.
    cutoffs: dict[str, dict[tuple[str, int], int]] = field(default_factory=dict)
    redacted: dict[str, set[uuid.UUID]] = field(default_factory=dict)  # by subject
    erasing: set[MemoryKey] = field(default_factory=set)

    def balance(self, key: MemoryKey) -> int | None:
        credit = self.credits.get(key)
        if credit is None:
            return None
        spent = sum(
            e.cost_micro_usd
            for e in self.ledger.values()
            if MemoryKey(e.organization_id, e.user_id) == key
        )
        return credit - spent

    def user_facts(self, key: MemoryKey) -> list[Fact]:
        """The memory's facts as the Postgres adapters list them: created_at, then fact id."""
        facts = [f for f in self.facts.values() if f.key == key]
        return sorted(facts, key=lambda f: (f.created_at, f.fact_id))
