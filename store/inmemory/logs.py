"""The event log and the run log in memory (`EventLog`, `RunLog`)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import datetime

from domain.erasure import REDACTED_JSON, REDACTION
from domain.ids import MemoryKey
from domain.model import KafkaCoordinates, LoggedEvent, LoggedRun
from domain.ports import Appended
from producers.contract import ContextEvent, EventType
from store.inmemory.database import InMemoryDatabase


def _key(event: ContextEvent) -> MemoryKey:
    return MemoryKey(event.organization_id, event.user_id)


class InMemoryEventLog:
    """Append-only and idempotent on (memory, event_id), like `context_events`; an event an
    erasure's cut-offs forgot is not stored (`subjects` names memories as the erasure does)."""

    def __init__(self, db: InMemoryDatabase, subjects: Callable[[MemoryKey], str]) -> None:
        self._db = db
        self._subjects = subjects
        self._events: dict[tuple[MemoryKey, uuid.UUID], LoggedEvent[ContextEvent]] = {}

    def append(self, events: Sequence[tuple[ContextEvent, KafkaCoordinates | None]]) -> Appended:
        with self._db.lock:
            new = forgotten = 0
            for event, at in events:
                if at is not None:
                    cutoffs = self._db.cutoffs.get(self._subjects(_key(event)), {})
                    if at.offset < cutoffs.get((at.topic, at.partition), -1):
                        forgotten += 1
                        continue
                if (_key(event), event.event_id) not in self._events:
                    seq = len(self._events) + 1
                    if event.event_id in self._db.redacted.get(self._subjects(_key(event)), ()):
                        scaffold = event.event_type is EventType.SCAFFOLD_UPDATE
                        erased = REDACTED_JSON if scaffold else REDACTION
                        event = event.model_copy(update={"content": erased})  # noqa: PLW2901
                    entry = LoggedEvent(seq, event, self._db.clock())
                    self._events[(_key(event), event.event_id)] = entry
                    new += 1
            return Appended(new, forgotten)

    def user_events(
        self, key: MemoryKey, *, until: datetime | None = None
    ) -> list[LoggedEvent[ContextEvent]]:
        with self._db.lock:
            return [
                e
                for (k, _), e in self._events.items()
                if k == key and (until is None or e.event.occurred_at <= until)
            ]


class InMemoryRunLog:
    """The runs the in-memory memory store recorded, in log order."""

    def __init__(self, db: InMemoryDatabase) -> None:
        self._db = db

    def runs(self, key: MemoryKey) -> list[LoggedRun]:
        with self._db.lock:
            return [r for r in self._db.runs.values() if r.run.key == key]
