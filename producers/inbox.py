"""The autonomous inbox cycle's side: what it learned while triaging a user's mail."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from producers._user_events import UserEventClient, derived_key
from producers.contract import ContextEvent, EventType, Source, SourceMetadata, utc_now


class InboxContextUpdates(UserEventClient):
    def update_user_context(
        self,
        scaffold_updates: Mapping[str, Any],
        persistent_info_additions: Sequence[str],
        *,
        cycle_id: str | None = None,
    ) -> list[ContextEvent]:
        """One `scaffold_update` event per key and one `learned_fact` per distinct addition, sent
        together.

        With a `cycle_id` the event ids are derived from it, so re-running the same inbox cycle
        publishes the same events and downstream deduplicates them.
        """
        now = utc_now()
        meta = SourceMetadata(source=Source.AUTONOMOUS, session_id=cycle_id)

        def key(*parts: str) -> str | None:
            # A learned fact is keyed by its text, not its place: a cycle run again in another
            # order is the same.
            return None if cycle_id is None else derived_key(self._user_id, cycle_id, *parts)

        events = [
            self._event(
                EventType.SCAFFOLD_UPDATE,
                json.dumps(value, sort_keys=True, ensure_ascii=False),
                meta,
                key=key("scaffold", name),
                at=now,
                scaffold_key=name,
            )
            for name, value in scaffold_updates.items()
        ]
        events += [
            self._event(EventType.LEARNED_FACT, text, meta, key=key("learned", text), at=now)
            for text in dict.fromkeys(persistent_info_additions)
        ]
        if events:
            self._publisher.publish(events)
        return events
