"""The chat service's side: the `record_observation` tool the agent calls during a turn."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from producers.contract import (
    MAX_CONTENT_CHARS,
    ContextEvent,
    EventType,
    Source,
    SourceMetadata,
    new_event_id,
    utc_now,
)
from producers.publisher import EventPublisher

OBSERVATION_CATEGORIES: Final = (
    EventType.FACT,
    EventType.PREFERENCE,
    EventType.PROJECT_DETAILS,
    EventType.CORRECTION,
)

RECORD_OBSERVATION_TOOL: Final[dict[str, Any]] = {
    "name": "record_observation",
    "description": (
        "Remember something durable the user revealed about themselves: a fact, a "
        "preference, details of a project, or a correction of something remembered before. "
        "Do not record small talk or anything that only matters for this turn."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "content": {
                "type": "string",
                "description": "The observation, in one self-contained sentence.",
                "maxLength": MAX_CONTENT_CHARS,
            },
            "category": {
                "type": "string",
                "enum": [c.value for c in OBSERVATION_CATEGORIES],
            },
        },
        "required": ["content", "category"],
    },
}


@dataclass(frozen=True)
class ChatScope:
    """Who the chat turn belongs to; fixed for a session."""

    user_id: str
    organization_id: str
    session_id: str | None = None
    connection_id: str | None = None


class ChatObservations:
    def __init__(self, publisher: EventPublisher, scope: ChatScope) -> None:
        self._publisher = publisher
        self._scope = scope

    def record_observation(
        self,
        content: str,
        category: str,
        *,
        message_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> ContextEvent:
        """Publish one observation; raises `PublishError` if the broker did not take it.

        Raises `ValueError` for a category outside `OBSERVATION_CATEGORIES` or invalid content.
        """
        event_type = EventType(category)
        if event_type not in OBSERVATION_CATEGORIES:
            raise ValueError(f"category must be one of {[c.value for c in OBSERVATION_CATEGORIES]}")
        event = ContextEvent(
            event_id=new_event_id(idempotency_key),
            user_id=self._scope.user_id,
            organization_id=self._scope.organization_id,
            event_type=event_type,
            content=content,
            source_metadata=SourceMetadata(
                source=Source.INTERACTIVE,
                session_id=self._scope.session_id,
                connection_id=self._scope.connection_id,
                message_id=message_id,
            ),
            occurred_at=utc_now(),
        )
        self._publisher.publish([event])
        return event
