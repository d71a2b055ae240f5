"""A log batch cut into append transactions of a bounded number of memories, in its order;
a logged row read back as its event."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from domain.erasure import REDACTED_JSON, REDACTION
from store.write.event_log import _event_from_row, memory_bounded_parts
from tests.support.builders import BASE_TIME, make_event

USERS = [f"user-{i}" for i in range(6)]
EVENTS = {(u, o): make_event(u, f"{u} said something", org=o) for u in USERS for o in ("a", "b")}


@given(st.lists(st.sampled_from(sorted(EVENTS)), max_size=40), st.integers(1, 5))
def test_parts_keep_the_order_and_hold_at_most_the_limit_of_memories(
    picks: list[tuple[str, str]], limit: int
) -> None:
    batch = [(EVENTS[p], None) for p in picks]
    parts = memory_bounded_parts(batch, limit)

    assert [x for part in parts for x in part] == batch
    memories = [{(e.organization_id, e.user_id) for e, _ in part} for part in parts]
    assert all(len(m) <= limit for m in memories)
    # A part ends only where the next event would be one memory too many.
    for part, nxt in zip(memories, parts[1:], strict=False):
        first = nxt[0][0]
        assert len(part) == limit
        assert (first.organization_id, first.user_id) not in part


def test_the_same_user_id_in_two_organizations_is_two_memories() -> None:
    batch = [(EVENTS[("user-0", "a")], None), (EVENTS[("user-0", "b")], None)]
    assert [len(p) for p in memory_bounded_parts(batch, 1)] == [1, 1]


def test_a_row_logged_with_the_no_connection_sentinel_reads_back_as_no_connection() -> None:
    # The contract refuses the sentinel as a connection id now; a row logged before it did
    # must still load (replay, export), as what it was treated as: no connection.
    event = make_event("ada", "Ada uses Gmail")
    row = (
        *(7, event.event_id, 1, "ada", "org-a", "fact", event.content, None),
        *("interactive", None, "__none__", None, None, None, None, BASE_TIME, BASE_TIME),
    )
    logged = _event_from_row(row)
    assert logged.event.source_metadata.connection_id is None
    assert logged.event.event_id == event.event_id


@pytest.mark.parametrize(
    ("event_type", "scaffold_key", "content"),
    [
        ("fact", None, REDACTION),
        ("scaffold_update", "Role", REDACTED_JSON),
        # Its content was JSON naming the fact; redacted, it no longer is.
        ("fact_retraction", None, REDACTION),
    ],
)
def test_a_row_an_erasure_redacted_reads_back_redacted(
    event_type: str, scaffold_key: str | None, content: str
) -> None:
    # The contract refuses that content from a producer; in the log it is an erasure's, and
    # the row must still load (replay, export, the flush that drops it).
    event = make_event("ada", "Ada uses Gmail")
    row = (
        *(7, event.event_id, 1, "ada", "org-a", event_type, content, scaffold_key),
        *("interactive", None, None, None, None, None, None, BASE_TIME, BASE_TIME),
    )
    logged = _event_from_row(row)
    assert (logged.event.event_type, logged.event.content) == (event_type, content)
