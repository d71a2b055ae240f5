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
