"""Turning a Kafka record into a `ContextEvent`, or into the reason it is not one."""

from __future__ import annotations

import json
from dataclasses import dataclass

from pydantic import ValidationError

from producers.contract import ContextEvent

MAX_REASON_CHARS = 900


@dataclass(frozen=True)
class Rejected:
    stage: str  # "decode" (not JSON) or "validate" (JSON, but not a valid event)
    reason: str


def decode_event(value: bytes | None) -> ContextEvent | Rejected:
    if value is None:
        return Rejected("decode", "record has no value (tombstone)")
    try:
        data = json.loads(value)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return Rejected("decode", f"not JSON: {e}"[:MAX_REASON_CHARS])
    try:
        return ContextEvent.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
            for err in e.errors()
        )
        return Rejected("validate", f"invalid ContextEvent: {problems}"[:MAX_REASON_CHARS])
