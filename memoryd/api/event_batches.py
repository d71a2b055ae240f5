"""The answer to a `POST /v1/events` that Kafka did not acknowledge whole.

The publisher is idempotent, not transactional: the events acknowledged are on the topic
whatever became of the others, so the answer names both. Its status says what sending the
others again can do: 503 if one of them may get through, 422 if the broker refuses each of
them for what it is. Either way not a 2xx, so a client that reads only the status does not
take the request for done; sending it whole again is safe, an `event_id` being taken once.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from fastapi import status
from fastapi.responses import JSONResponse

from memoryd.api.models import (
    Accepted,
    EventsNotAccepted,
    NotAccepted,
    Problem,
    ValidationProblems,
)
from producers.contract import ContextEvent
from producers.errors import PublishError, Undelivered

# The route's answers besides 202: a 422 is an invalid request or events refused as they are.
NOT_ALL_ACCEPTED: dict[int | str, dict[str, Any]] = {
    422: {"model": ValidationProblems | EventsNotAccepted},
    503: {"model": EventsNotAccepted | Problem},
}


def not_accepted_answer(events: Sequence[ContextEvent], error: PublishError) -> JSONResponse:
    undelivered = error.undelivered or [
        # The error names no event: none of them is known to be on the topic.
        Undelivered(p, str(error), retriable=True)
        for p in range(len(events))
    ]
    failed = {u.position for u in undelivered}
    accepted = _unique(e.event_id for p, e in enumerate(events) if p not in failed)
    taken = set(accepted)
    refused: dict[uuid.UUID, NotAccepted] = {}
    for u in undelivered:
        event_id = events[u.position].event_id
        if event_id not in taken:
            refused.setdefault(
                event_id, NotAccepted(event_id=event_id, reason=u.reason, retriable=u.retriable)
            )
    if not refused:
        # Each event not acknowledged was the same event as one that was, sent twice.
        return JSONResponse(
            Accepted(event_ids=accepted).model_dump(mode="json"),
            status_code=status.HTTP_202_ACCEPTED,
        )
    body = EventsNotAccepted(
        detail=f"{len(refused)} of {len(taken) + len(refused)} event(s) not accepted",
        event_ids=accepted,
        not_accepted=list(refused.values()),
    )
    retriable = any(r.retriable for r in refused.values())
    code = (
        status.HTTP_503_SERVICE_UNAVAILABLE if retriable else status.HTTP_422_UNPROCESSABLE_CONTENT
    )
    return JSONResponse(body.model_dump(mode="json"), status_code=code)


def _unique(ids: Iterable[uuid.UUID]) -> list[uuid.UUID]:
    return list(dict.fromkeys(ids))
