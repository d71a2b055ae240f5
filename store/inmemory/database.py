"""The tables of one in-memory database, and the lock that makes each write a transaction."""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

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
    memory: dict[str, MemoryState] = field(default_factory=dict)
    facts: dict[uuid.UUID, Fact] = field(default_factory=dict)
    consolidated: dict[uuid.UUID, uuid.UUID] = field(default_factory=dict)  # event → run
    runs: dict[uuid.UUID, LoggedRun] = field(default_factory=dict)  # in log order
    ledger: dict[uuid.UUID, LedgerEntry] = field(default_factory=dict)
    credits: dict[str, int] = field(default_factory=dict)
    connections: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)
    context_logs: dict[uuid.UUID, ContextLogRow] = field(default_factory=dict)

    def balance(self, user_id: str) -> int | None:
        credit = self.credits.get(user_id)
        if credit is None:
            return None
        spent = sum(e.cost_micro_usd for e in self.ledger.values() if e.user_id == user_id)
        return credit - spent

    def user_facts(self, user_id: str) -> list[Fact]:
        """The user's facts as the Postgres adapters list them: created_at, then fact id."""
        facts = [f for f in self.facts.values() if f.user_id == user_id]
        return sorted(facts, key=lambda f: (f.created_at, f.fact_id))
