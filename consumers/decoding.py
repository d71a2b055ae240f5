"""Turning a Kafka record into a `ContextEvent` (or a memory's tombstone), or into the reason
it is neither."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from consumers.batching import TopicPartition
from consumers.dead_letter import DeadLetter
from producers.contract import NUL_CHECKED, TOMBSTONE_KIND, ContextEvent, MemoryTombstone

MAX_REASON_CHARS = 900
# A reason names what is wrong; it quotes at most this much of any one piece of the input
# (a field name, a value), so a letter's headers never carry a copy of its payload.
MAX_EXCERPT_CHARS = 40
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
        data = _parse(value)
        if isinstance(data, dict) and data.get("kind") == TOMBSTONE_KIND:
            try:
                return MemoryTombstone.model_validate(data)
            except ValidationError as e:
                return Rejected("validate", f"invalid MemoryTombstone: {_problems(e)}")
    return decode_event(value)


def decode_event(value: bytes | None) -> ContextEvent | Rejected:
    if value is None:
        return Rejected("decode", "record has no value (tombstone)")
    data = _parse(value)
    if isinstance(data, Rejected):
        return data
    # JSON spells NUL only as the escape \u0000 (a raw NUL byte does not parse): without that
    # sequence in the text, no string of the value holds NUL and the contract need not look.
    checked = None if _NUL_ESCAPE in value else NUL_CHECKED
    try:
        return ContextEvent.model_validate(data, context=checked)
    except ValidationError as e:
        return Rejected("validate", f"invalid ContextEvent: {_problems(e)}"[:MAX_REASON_CHARS])


def _parse(value: bytes) -> Any:
    """The JSON value of a record, or why it is not one. An object with a key twice is
    refused: which of its values a reader takes differs from reader to reader."""
    try:
        # Strict UTF-8 first: json.loads would let encoded surrogates through on bytes.
        return json.loads(value.decode("utf-8"), object_pairs_hook=_unique_keys)
    except UnicodeDecodeError as e:
        return Rejected("decode", f"not JSON: invalid UTF-8: {e}"[:MAX_REASON_CHARS])
    except _DuplicateKeyError as e:
        return Rejected("decode", f"not JSON: duplicate key {excerpt(str(e))}")
    except json.JSONDecodeError as e:
        return Rejected("decode", f"not JSON: {e}"[:MAX_REASON_CHARS])
    except RecursionError:
        return Rejected("decode", "not JSON: nested too deeply")
    except ValueError as e:  # the JSON is well formed, a number in it too long to convert
        return Rejected("decode", f"not JSON: a number is too long to convert ({type(e).__name__})")


class _DuplicateKeyError(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)  # in C; a key seen twice leaves the dict shorter than the pairs
    if len(out) == len(pairs):
        return out
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _DuplicateKeyError(key)
        seen.add(key)
    raise AssertionError("unreachable: a shorter dict has a repeated key")


def excerpt(text: str, limit: int = MAX_EXCERPT_CHARS) -> str:
    """`text` quoted, cut to `limit` characters with an ellipsis: what an error may echo."""
    cut = text if len(text) <= limit else text[: limit - 1] + "…"
    return repr(cut)


def _problems(e: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(_loc(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in e.errors()
    )[:MAX_REASON_CHARS]


def _loc(part: str | int) -> str:
    # A location names a field of the input, which may be any key the sender chose.
    text = str(part)
    return text if len(text) <= MAX_EXCERPT_CHARS else excerpt(text)
