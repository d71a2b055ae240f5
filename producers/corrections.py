"""A user's own say over their memory: delete one fact, or correct it.

Both are events through the same pipeline as everything else, so the log keeps them and the
processor applies them in order with the user's other observations. A correction is two
events: a `fact_retraction` of the fact (reason `corrected`) and a `correction` with what is
true, which the consolidation turns into a fact like any other observation.
"""

from __future__ import annotations

import uuid

from producers._user_events import UserEventClient, derived_key
from producers.contract import (
    ContextEvent,
    EventType,
    FactRetraction,
    RetractionReason,
    Source,
    SourceMetadata,
)


class FactCorrections(UserEventClient):
    def delete_fact(
        self, fact_id: uuid.UUID, *, idempotency_key: str | None = None
    ) -> ContextEvent:
        """Publish the retraction of one fact; raises `PublishError` if the broker did not
        take it. With an idempotency key a retried call publishes the same event."""
        event = self._retraction(fact_id, RetractionReason.DELETED, idempotency_key, None)
        self._publisher.publish([event])
        return event

    def correct_fact(
        self,
        fact_id: uuid.UUID,
        content: str,
        *,
        connection_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> list[ContextEvent]:
        """Publish the retraction of a fact and the correction that replaces it, in order."""
        retraction = self._retraction(
            fact_id, RetractionReason.CORRECTED, idempotency_key, connection_id
        )
        correction = self._event(
            EventType.CORRECTION,
            content,
            SourceMetadata(source=Source.INTERACTIVE, connection_id=connection_id),
            key=_event_key(idempotency_key, fact_id, EventType.CORRECTION.value),
            at=retraction.occurred_at,
        )
        events = [retraction, correction]
        self._publisher.publish(events)
        return events

    def _retraction(
        self,
        fact_id: uuid.UUID,
        reason: RetractionReason,
        idempotency_key: str | None,
        connection_id: str | None,
    ) -> ContextEvent:
        return self._event(
            EventType.FACT_RETRACTION,
            FactRetraction(fact_id=fact_id, reason=reason).model_dump_json(),
            SourceMetadata(source=Source.INTERACTIVE, connection_id=connection_id),
            key=_event_key(idempotency_key, fact_id, reason.value),
        )


def _event_key(idempotency_key: str | None, fact_id: uuid.UUID, role: str) -> str | None:
    """The key of one event of a request: the caller's key is reused across facts and kinds
    of request."""
    return None if idempotency_key is None else derived_key(idempotency_key, str(fact_id), role)
