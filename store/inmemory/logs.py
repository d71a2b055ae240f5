"""The event log and the run log in memory (`EventLog`, `RunLog`)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from domain.model import KafkaCoordinates, LoggedEvent, LoggedRun
from producers.contract import ContextEvent
from store.inmemory.database import InMemoryDatabase


class InMemoryEventLog:
    """Append-only and idempotent on event_id, like `context_events`."""

    def __init__(self, db: InMemoryDatabase) -> None:
        self._db = db
        self._events: dict[uuid.UUID, LoggedEvent[ContextEvent]] = {}

    def append(self, events: Sequence[tuple[ContextEvent, KafkaCoordinates | None]]) -> int:
        with self._db.lock:
            new = 0
            for event, _at in events:
                if event.event_id not in self._events:
                    seq = len(self._events) + 1
                    self._events[event.event_id] = LoggedEvent(seq, event, self._db.clock())
                    new += 1
            return new

    def user_events(
        self, user_id: str, *, until: datetime | None = None
    ) -> list[LoggedEvent[ContextEvent]]:
        with self._db.lock:
            return [
                e
                for e in self._events.values()
                if e.event.user_id == user_id and (until is None or e.event.occurred_at <= until)
            ]


class InMemoryRunLog:
    """The runs the in-memory memory store recorded, in log order."""

    def __init__(self, db: InMemoryDatabase) -> None:
        self._db = db

    def runs(self, user_id: str) -> list[LoggedRun]:
        with self._db.lock:
            return [r for r in self._db.runs.values() if r.run.user_id == user_id]
