"""Decoding a Kafka record: an event, a tombstone, or the stage and reason it is neither."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumers.decoding import Rejected, decode_record
from domain.erasure import REDACTED_JSON, REDACTION
from producers.contract import (
    ContextEvent,
    EventType,
    MemoryTombstone,
    Source,
    SourceMetadata,
    has_nul,
)

EVENT = ContextEvent(
    event_id=uuid.UUID("00000000-0000-4000-8000-000000000001"),
    user_id="ada",
    organization_id="acme",
    event_type=EventType.FACT,
    content="Ada moved to Lisbon",
    source_metadata=SourceMetadata(source=Source.INTERACTIVE, session_id="s-1"),
    occurred_at=datetime(2026, 11, 23, 12, 0, tzinfo=UTC),
)


def event_json(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(EVENT.to_bytes())
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        target = data
        for p in parents:
            target = target[p]
        target[leaf] = value
    return data


def raw(**changes: Any) -> bytes:
    return json.dumps(event_json(**changes)).encode()


def scaffold(content: str) -> bytes:
    return raw(event_type="scaffold_update", scaffold_key="Profile", content=content)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (EVENT.to_bytes(), EVENT),
        (scaffold('{"Nick": "\\ud83d\\ude00", "Age": 1.5e3}'), "ude00"),
        (raw(content="Ada wrote C:\\u0000 in a path"), "C:\\u0000"),  # backslash, not NUL
        (raw(content="Ada likes café ☕"), "café ☕"),
        (json.dumps(event_json(), ensure_ascii=True).encode(), EVENT),
        # Only the very text an erasure leaves is reserved.
        (raw(content=f"Ada saw {REDACTION} in a letter"), REDACTION),
        (scaffold(f"[{REDACTED_JSON}]"), REDACTED_JSON),
    ],
)
def test_valid_events_decode(value: bytes, expected: ContextEvent | str) -> None:
    decoded = decode_record(value)
    assert isinstance(decoded, ContextEvent)
    if isinstance(expected, ContextEvent):
        assert decoded == expected
    else:
        assert expected in decoded.content


@pytest.mark.parametrize(
    ("value", "stage", "reason"),
    [
        (None, "decode", "no value"),
        (b"{not json", "decode", "not JSON"),
        (b"\xff\xfe{}", "decode", "not JSON"),
        (EVENT.to_bytes()[:-3], "decode", "not JSON"),
        (EVENT.to_bytes().replace(b"Lisbon", b"Lis\x00bon"), "decode", "not JSON"),
        (raw(content="Lis\x00bon"), "validate", "NUL"),
        (raw(source_metadata__session_id="s\x00"), "validate", "NUL"),
        (raw(content="\x00", user_id=""), "validate", "NUL"),
        (raw(user_id="ada lovelace"), "validate", "user_id"),
        # What memoryd stores for "no connection": as a connection it would be none.
        (raw(source_metadata__connection_id="__none__"), "validate", "reserved by memoryd"),
        # What a fact erasure writes over an event's text: the flush would drop it as erased.
        (raw(content=REDACTION), "validate", "reserved by memoryd"),
        (raw(content=REDACTED_JSON, event_type="correction"), "validate", "reserved by memoryd"),
        (scaffold(REDACTED_JSON), "validate", "reserved by memoryd"),
        (raw(event_type="rumour"), "validate", "event_type"),
        (raw(extra_field=1), "validate", "extra_field"),
        (raw(occurred_at="2026-11-23T12:00:00"), "validate", "occurred_at"),
        # Year 10000 and year 0 in UTC: Postgres stores both, and no reader could load them.
        (raw(occurred_at="9999-12-31T23:59:59-01:00"), "validate", "occurred_at"),
        (raw(occurred_at="0001-01-01T00:00:00+05:00"), "validate", "occurred_at"),
        (scaffold("NaN"), "validate", "not a JSON number"),
        (scaffold("[1e999]"), "validate", "out of range"),
        (scaffold('{"Nick": "\\ud800"}'), "validate", "lone surrogate"),
        (b"[1, 2]", "validate", "invalid ContextEvent"),
        (b"42", "validate", "invalid ContextEvent"),
    ],
)
def test_bad_records_are_rejected_with_their_stage_and_reason(
    value: bytes | None, stage: str, reason: str
) -> None:
    decoded = decode_record(value)
    assert isinstance(decoded, Rejected)
    assert decoded.stage == stage
    assert reason in decoded.reason


def test_a_tombstone_decodes_as_one_and_a_malformed_one_is_rejected() -> None:
    tombstone = MemoryTombstone(
        organization_id="acme",
        user_id="ada",
        erasure_id=uuid.uuid4(),
        forgotten_at=datetime(2026, 11, 23, tzinfo=UTC),
    )
    assert decode_record(tombstone.to_bytes()) == tombstone
    broken = json.loads(tombstone.to_bytes())
    del broken["erasure_id"]
    decoded = decode_record(json.dumps(broken).encode())
    assert isinstance(decoded, Rejected)
    assert decoded.stage == "validate"
    assert "erasure_id" in decoded.reason


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(JSON_VALUES, st.booleans())
def test_json_text_without_the_nul_escape_decodes_to_no_nul(value: Any, ascii_only: bool) -> None:
    # The decoder skips the contract's NUL walk when the text lacks the escape: this is why.
    text = json.dumps(value, ensure_ascii=ascii_only).encode()
    if b"\\u0000" not in text:
        assert not has_nul(json.loads(text))


@pytest.mark.parametrize("field", ["content", "source_metadata__session_id"])
def test_a_nul_is_refused_in_text_that_keeps_other_characters_unescaped(field: str) -> None:
    value = json.dumps(event_json(**{field: "Lisboa café\x00"}), ensure_ascii=False).encode()
    decoded = decode_record(value)
    assert isinstance(decoded, Rejected)
    assert "NUL" in decoded.reason
