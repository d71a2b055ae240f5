"""What a 422 says: where a request is invalid and why, quoting at most an excerpt of it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from consumers.decoding import MAX_EXCERPT_CHARS, excerpt

MAX_MESSAGE_CHARS = 300
MAX_PROBLEMS = 20


def validation_problems(errors: Sequence[Any]) -> list[dict[str, Any]]:
    """FastAPI's validation errors without the `input` (the whole invalid value) and `ctx`
    (which may hold it too): each keeps its `loc`, with long keys cut to an excerpt, its
    `msg` and its `type`. At most the first `MAX_PROBLEMS`."""
    return [
        {
            "loc": [_part(p) for p in error.get("loc", ())],
            "msg": str(error.get("msg", ""))[:MAX_MESSAGE_CHARS],
            "type": str(error.get("type", "")),
        }
        for error in list(errors)[:MAX_PROBLEMS]
    ]


def _part(part: Any) -> str | int:
    if isinstance(part, int):
        return part
    text = str(part)
    return text if len(text) <= MAX_EXCERPT_CHARS else excerpt(text)
