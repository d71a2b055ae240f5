"""Turning a Kafka record into a `ContextEvent` (or a memory's tombstone), or into the reason
it is neither."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from consumers.batching import TopicPartition
from consumers.dead_letter import DeadLetter
from producers.contract import TOMBSTONE_KIND, ContextEvent, MemoryTombstone

MAX_REASON_CHARS = 900
_NUL_ESCAPE = b"\\u0000"


@dataclass(frozen=True)
class Rejected:
    stage: str  # "decode" (not JSON) or "validate" (JSON, but not a valid event)
    reason: str

    def letter(
        self, key: bytes | None, value: bytes | None, tp: TopicPartition, offset: int
    ) -> DeadLetter:
        """The dead letter of the rejected record, byte for byte, with this reason."""
        return DeadLetter(key, value, self.stage, self.reason, tp.topic, tp.partition, offset)


def decode_record(value: bytes | None) -> ContextEvent | MemoryTombstone | Rejected:
    """An event, a tombstone (`kind` = memory_forgotten, which no event has), or why neither."""
    if value is not None and TOMBSTONE_KIND.encode() in value:
        try:
            data = json.loads(value)
        except (json.JSONDecodeError, UnicodeDecodeError):
            data = None
        if isinstance(data, dict) and data.get("kind") == TOMBSTONE_KIND:
            try:
                return MemoryTombstone.model_validate(data)
            except ValidationError as e:
                return Rejected("validate", f"invalid MemoryTombstone: {_problems(e)}")
    return decode_event(value)


def decode_event(value: bytes | None) -> ContextEvent | Rejected:
    if value is None:
        return Rejected("decode", "record has no value (tombstone)")
    if _NUL_ESCAPE in value or b"\x00" in value:
        return _decode_checking_nul(value)
    # JSON can carry a NUL only as the escape above, so without it pydantic parses the bytes
    # itself: half the cost of json.loads followed by validating the dict (bench.ingest).
    try:
        return ContextEvent.model_validate_json(value)
    except ValidationError as e:
        if any(err["type"] == "json_invalid" for err in e.errors()):
            return _decode_checking_nul(value)  # the json module words the reason
        return _invalid(e)


def _decode_checking_nul(value: bytes) -> ContextEvent | Rejected:
    try:
        data = json.loads(value)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return Rejected("decode", f"not JSON: {e}"[:MAX_REASON_CHARS])
    if _has_nul(data):
        # Valid JSON and a valid event for pydantic, but Postgres text cannot hold NUL: it
        # would fail every write of its batch (the log, then W and facts) again and again.
        return Rejected("validate", "invalid ContextEvent: a string contains a NUL character")
    try:
        return ContextEvent.model_validate(data)
    except ValidationError as e:
        return _invalid(e)


def _invalid(e: ValidationError) -> Rejected:
    return Rejected("validate", f"invalid ContextEvent: {_problems(e)}"[:MAX_REASON_CHARS])


def _problems(e: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in e.errors()
    )[:MAX_REASON_CHARS]


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False
