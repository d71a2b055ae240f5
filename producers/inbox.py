"""The autonomous inbox cycle's side: what it learned while triaging a user's mail."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from producers.contract import (
    ContextEvent,
    EventType,
    Source,
    SourceMetadata,
    new_event_id,
    utc_now,
)
from producers.publisher import EventPublisher


class InboxContextUpdates:
    def __init__(self, publisher: EventPublisher, user_id: str, organization_id: str) -> None:
        self._publisher = publisher
        self._user_id = user_id
        self._organization_id = organization_id

    def update_user_context(
        self,
        scaffold_updates: Mapping[str, Any],
        persistent_info_additions: Sequence[str],
        *,
        cycle_id: str | None = None,
    ) -> list[ContextEvent]:
        """One `scaffold_update` event per key and one `learned_fact` per addition, sent together.

        With a `cycle_id` the event ids are derived from it, so re-running the same inbox cycle
        publishes the same events and downstream deduplicates them.
        """
        now = utc_now()
        meta = SourceMetadata(source=Source.AUTONOMOUS, session_id=cycle_id)

        def key(*parts: str) -> str | None:
            return None if cycle_id is None else "\x1f".join((self._user_id, cycle_id, *parts))

        events = [
            ContextEvent(
                event_id=new_event_id(key("scaffold", name)),
                user_id=self._user_id,
                organization_id=self._organization_id,
                event_type=EventType.SCAFFOLD_UPDATE,
                scaffold_key=name,
                content=json.dumps(value, sort_keys=True, ensure_ascii=False),
                source_metadata=meta,
                occurred_at=now,
            )
            for name, value in scaffold_updates.items()
        ]
        events += [
            ContextEvent(
                event_id=new_event_id(key("learned", str(i), text)),
                user_id=self._user_id,
                organization_id=self._organization_id,
                event_type=EventType.LEARNED_FACT,
                content=text,
                source_metadata=meta,
                occurred_at=now,
            )
            for i, text in enumerate(persistent_info_additions)
        ]
        if events:
            self._publisher.publish(events)
        return events
