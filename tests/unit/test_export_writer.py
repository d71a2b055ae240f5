"""`memoryd export` writes its long sections as they are read: the same text as one json.dump,
and a section cut short by a failed write is ended at once."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from memoryd.analyst.export import Counted, _write_object, write_json

AT = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    "doc",
    [
        {},
        {"events": []},
        {"format": "memoryd-export/1", "events": [], "memory": {}, "facts": [{}]},
        {
            "user_id": "ada",
            "events": [{"content": "line one\nline two", "tags": ["a", "ü"], "n": 1.5}],
            "memory": {"scaffold": {"Role": {"Title": "Designer"}}, "learned_info": []},
            "runs": [{"output": {"applied": {"facts": [{"at": AT}]}}, "id": uuid.UUID(int=1)}],
            "balance_micro_usd": None,
        },
    ],
)
def test_a_streamed_export_is_the_text_json_dump_writes(
    doc: dict[str, Any], tmp_path: Path
) -> None:
    streamed = {k: Counted(v) if isinstance(v, list) else v for k, v in doc.items()}
    out = tmp_path / "export.json"
    write_json(out, streamed)
    assert out.read_text() == json.dumps(doc, ensure_ascii=False, indent=2, default=str)
    assert [v.count for v in streamed.values() if isinstance(v, Counted)] == [
        len(v) for v in doc.values() if isinstance(v, list)
    ]


class FullDisk(io.StringIO):
    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room

    def write(self, s: str) -> int:
        if self.tell() + len(s) > self.room:
            raise OSError(28, "No space left on device")
        return super().write(s)


def test_a_section_cut_short_by_a_failed_write_is_ended_at_once() -> None:
    ended: list[str] = []

    def cursor() -> Iterator[dict[str, int]]:
        try:
            yield from ({"n": i} for i in range(1_000))
        finally:
            ended.append("events")  # where a server-side cursor's transaction ends

    ended_when_handled: list[str] = []
    try:
        _write_object(FullDisk(room=200), {"events": Counted(cursor())})
    except OSError:
        # The command's handler leaves the snapshot: the section's cursor must be ended by then.
        ended_when_handled = list(ended)
    assert ended_when_handled == ["events"]
