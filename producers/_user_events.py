"""What the inbox, tool and correction clients share: a publisher, and the one user (in one
organization) that every event they build is about."""

from __future__ import annotations

import json
from datetime import datetime

from producers.contract import ContextEvent, EventType, SourceMetadata, new_event_id, utc_now
from producers.publisher import EventPublisher


class UserEventClient:
    def __init__(self, publisher: EventPublisher, user_id: str, organization_id: str) -> None:
        self._publisher = publisher
        self._user_id = user_id
        self._organization_id = organization_id

    def _event(
        self,
        event_type: EventType,
        content: str,
        meta: SourceMetadata,
        *,
        key: str | None = None,
        at: datetime | None = None,
        scaffold_key: str | None = None,
    ) -> ContextEvent:
        """An event about this client's user; `key` makes its id stable (`new_event_id`)."""
        return ContextEvent(
            event_id=new_event_id(key),
            user_id=self._user_id,
            organization_id=self._organization_id,
            event_type=event_type,
            content=content,
            scaffold_key=scaffold_key,
            source_metadata=meta,
            occurred_at=at or utc_now(),
        )


def derived_key(*parts: object) -> str:
    """The idempotency key of an event derived from these parts. Labels and callers' keys may
    hold any character, so no separator could be trusted: the parts go in a JSON array, which
    no other parts can spell."""
    return json.dumps(list(parts))
