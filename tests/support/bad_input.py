"""Hypothesis strategies of Kafka records, valid and bad, and the checks every consumer's
answer to a bad record must pass (a reason that names the problem and quotes little)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import assume
from hypothesis import strategies as st

from consumers.decoding import MAX_EXCERPT_CHARS, MAX_REASON_CHARS
from producers.contract import MAX_CONTENT_CHARS, RESERVED_CONTENTS, ContextEvent, EventType

# Letters no message of the decoder or of pydantic is made of: a reason holding a run of them
# longer than an excerpt copied it from the input.
MARKER_ALPHABET = "QXZJVK"
REQUIRED = (
    "schema_version",
    "event_id",
    "user_id",
    "organization_id",
    "event_type",
    "content",
    "source_metadata",
    "occurred_at",
)

ids = st.text("abcdefgh0123456789-_.:@", min_size=1, max_size=12)
# Any text Postgres and JSON can carry: no NUL, no lone surrogate.
texts = st.text(
    st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), min_size=1, max_size=40
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
markers = st.text(MARKER_ALPHABET, min_size=MAX_EXCERPT_CHARS + 20, max_size=120)


@st.composite
def valid_events(draw: st.DrawFn) -> ContextEvent:
    kind = draw(st.sampled_from(EventType))
    meta: dict[str, Any] = {"source": draw(st.sampled_from(["interactive", "autonomous", "tool"]))}
    extra: dict[str, Any] = {}
    content = draw(texts)
    if kind is EventType.SCAFFOLD_UPDATE:
        extra["scaffold_key"] = draw(texts)
        content = json.dumps(draw(json_values), ensure_ascii=draw(st.booleans()))
    elif kind is EventType.FACT_RETRACTION:
        content = json.dumps({"fact_id": str(draw(st.uuids())), "reason": "deleted"})
    # Hypothesis draws the literals of the code under test, the erasure's marker among them.
    assume(content not in RESERVED_CONTENTS)
    if kind is EventType.CONNECTION_UPDATE or draw(st.booleans()):
        meta["connection_id"] = draw(ids)
    if kind is EventType.TOOL_OUTPUT or draw(st.booleans()):
        meta["tool_id"] = draw(texts)
    return ContextEvent.model_validate(
        {
            "event_id": draw(st.uuids()),
            "user_id": draw(st.sampled_from(["ada", "bob", "cy"])),
            "organization_id": draw(st.sampled_from(["org-a", "org-b"])),
            "event_type": kind,
            "content": content,
            "source_metadata": meta,
            "occurred_at": datetime(2026, 1, 1, tzinfo=UTC)
            + timedelta(minutes=draw(st.integers(0, 10**5))),
            **extra,
        }
    )


@dataclass(frozen=True)
class BadRecord:
    value: bytes | None
    stage: str  # the dead letter's stage
    names: tuple[str, ...]  # the reason must hold one of these (what is wrong)
    marker: str  # a piece of the input the reason may quote at most an excerpt of


def _event_dict(event: ContextEvent, marker: str) -> dict[str, Any]:
    data = json.loads(event.to_bytes())
    if event.event_type not in (EventType.SCAFFOLD_UPDATE, EventType.FACT_RETRACTION):
        data["content"] = f"{marker} {data['content']}"[:MAX_CONTENT_CHARS]
    return data


def _dumps(data: Any) -> bytes:
    return json.dumps(data).encode()


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@st.composite
def bad_records(draw: st.DrawFn) -> BadRecord:  # noqa: PLR0912 (one case each)
    marker = draw(markers)
    case = draw(st.integers(0, 14))
    if case == 11:
        return BadRecord(None, "decode", ("no value",), marker)
    data = {} if case == 0 else _event_dict(draw(valid_events()), marker)
    if case == 0:
        raw = draw(st.binary(max_size=200))
        try:  # a few byte strings are JSON (b"0"): then not an event
            json.loads(raw.decode())
        except ValueError:
            return BadRecord(raw, "decode", ("not JSON",), marker)
        return BadRecord(raw, "validate", ("invalid ContextEvent",), marker)
    if case == 1:
        raw = _dumps(data)
        at = draw(st.integers(0, len(raw)))
        bad_byte = draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80"]))
        return BadRecord(raw[:at] + bad_byte + raw[at:], "decode", ("not JSON",), marker)
    if case == 2:
        top = draw(st.sampled_from([[marker], 7, marker, None, True, 1.5]))
        return BadRecord(_dumps(top), "validate", ("<root>",), marker)
    if case == 3:
        field = draw(st.sampled_from([f for f in REQUIRED if f != "schema_version"]))
        del data[field]
        return BadRecord(_dumps(data), "validate", (field,), marker)
    if case == 4:
        field = draw(st.sampled_from(REQUIRED))
        data[field] = draw(st.sampled_from([[marker], {marker: 1}, None]))
        return BadRecord(_dumps(data), "validate", (field,), marker)
    if case == 5:
        data["event_type"] = "fact"
        data.pop("scaffold_key", None)
        data["content"] = draw(
            st.sampled_from(["", marker * (MAX_CONTENT_CHARS // len(marker) + 1)])
        )
        return BadRecord(_dumps(data), "validate", ("content",), marker)
    if case == 6:
        field = draw(st.sampled_from(["content", "user_id", "organization_id"]))
        at = draw(st.integers(0, len(data[field])))
        data[field] = data[field][:at] + "\x00" + data[field][at:]
        return BadRecord(_dumps(data), "validate", ("NUL",), marker)
    if case == 7:
        data["event_type"] = draw(st.sampled_from([marker, "FACT", "memory_forgotten", "fact "]))
        return BadRecord(_dumps(data), "validate", ("event_type",), marker)
    if case == 8:
        data["schema_version"] = draw(st.integers(2, 10**6) | st.sampled_from([0, "2"]))
        return BadRecord(_dumps(data), "validate", ("schema_version",), marker)
    if case == 9:
        field = draw(st.sampled_from(REQUIRED))
        raw = _dumps(data)
        again = json.dumps(draw(st.sampled_from([data[field], marker])))
        dup = raw[:-1] + f', "{field}": {again}}}'.encode()
        return BadRecord(dup, "decode", ("duplicate key",), marker)
    if case == 10:
        data[marker] = draw(json_values)
        return BadRecord(_dumps(data), "validate", ("Extra inputs",), marker)
    if case == 12:
        data["content"] = "@nested@"
        nested = _nested(draw(st.integers(30_000, 100_000))).encode()
        raw = _dumps(data).replace(b'"@nested@"', nested)
        return BadRecord(raw, "decode", ("nested too deeply",), marker)
    if case == 13:
        digits = "9" * draw(st.integers(4_400, 9_000))
        raw = _dumps(data)
        return BadRecord(raw[:-1] + f', "n": {digits}}}'.encode(), "decode", ("too long",), marker)
    data.update(event_type="scaffold_update", scaffold_key="k")
    data["content"] = _nested(draw(st.integers(33, MAX_CONTENT_CHARS // 2)))
    return BadRecord(_dumps(data), "validate", ("nested too deeply",), marker)


def wrong_headers() -> st.SearchStrategy[list[tuple[Any, Any]] | None]:
    """Kafka headers no consumer asked for, of any type a client library might hand over."""
    keys = st.one_of(st.text(max_size=20), st.binary(max_size=20), st.integers(), st.none())
    values = st.one_of(st.binary(max_size=40), st.text(max_size=40), st.integers(), st.none())
    return st.none() | st.lists(st.tuples(keys, values), max_size=4)


def check_reason(record: BadRecord, stage: str, reason: str) -> None:
    """The letter's stage is the record's, its reason names what is wrong, and it quotes no
    more of the input than an excerpt."""
    assert stage == record.stage, (stage, reason)
    assert any(name in reason for name in record.names), (record.names, reason)
    assert len(reason) <= MAX_REASON_CHARS
    window = MAX_EXCERPT_CHARS + 1
    for start in range(len(record.marker) - window + 1):
        assert record.marker[start : start + window] not in reason, reason


def event_id_of(value: bytes) -> uuid.UUID:
    return uuid.UUID(json.loads(value)["event_id"])
