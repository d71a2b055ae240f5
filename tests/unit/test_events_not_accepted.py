"""What `POST /v1/events` answers when Kafka did not acknowledge every event."""

from __future__ import annotations

import json
from typing import Any

import pytest

from memoryd.api.event_batches import not_accepted_answer
from producers.contract import ContextEvent
from producers.errors import PublishError, Undelivered
from tests.support.builders import make_event

A, B, C = (make_event("ada", text) for text in ("one", "two", "three"))


def answer(events: list[ContextEvent], undelivered: list[Undelivered]) -> tuple[int, Any]:
    response = not_accepted_answer(events, PublishError("not acknowledged", undelivered))
    return response.status_code, json.loads(bytes(response.body))


@pytest.mark.parametrize(
    ("undelivered", "status"),
    [
        ([Undelivered(1, "MessageSizeTooLargeError()", retriable=False)], 422),
        ([Undelivered(1, "KafkaTimeoutError()", retriable=True)], 503),
        (
            [
                Undelivered(1, "MessageSizeTooLargeError()", retriable=False),
                Undelivered(2, "KafkaTimeoutError()", retriable=True),
            ],
            503,  # one of them may get through when sent again
        ),
    ],
)
def test_the_answer_names_both_parts_and_says_whether_sending_again_helps(
    undelivered: list[Undelivered], status: int
) -> None:
    code, body = answer([A, B, C], undelivered)
    failed = {u.position for u in undelivered}
    assert code == status
    assert body["event_ids"] == [
        str(e.event_id) for p, e in enumerate([A, B, C]) if p not in failed
    ]
    assert [(n["event_id"], n["retriable"]) for n in body["not_accepted"]] == [
        (str([A, B, C][u.position].event_id), u.retriable) for u in undelivered
    ]


def test_an_event_sent_twice_and_acknowledged_once_is_accepted() -> None:
    code, body = answer([A, B, A], [Undelivered(2, "KafkaTimeoutError()", retriable=True)])
    assert (code, body) == (202, {"event_ids": [str(A.event_id), str(B.event_id)]})


def test_an_error_that_names_no_event_leaves_none_accepted() -> None:
    code, body = answer([A, B], [])
    assert code == 503
    assert body["event_ids"] == []
    assert [n["event_id"] for n in body["not_accepted"]] == [str(A.event_id), str(B.event_id)]
