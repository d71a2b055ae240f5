"""`replay verify --json` writes a memory's differences, whatever their type."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, date, datetime

from domain.ids import MemoryKey
from memoryd.analyst.verify import Verification, verification_json
from processors.diff import FactDiff, MemoryDiff

AT = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


def test_a_difference_in_a_fact_s_times_is_written_as_json() -> None:
    changed = FactDiff(
        uuid.UUID(int=7),
        "Ada moves to Porto in June.",
        {
            "updated_at": (AT, AT.replace(hour=10)),
            "event_date": (date(2027, 6, 1), None),
            "confidence": (0.8, 0.9),
        },
    )
    diff = MemoryDiff((), (), (changed,), None, {}, ((), ()), {})
    verification = Verification(MemoryKey("org-a", "ada"), 3, diff, None)
    doc = json.loads(json.dumps(verification_json(verification)))
    fields = doc["diff"]["facts_changed"][0]["fields"]
    assert fields["updated_at"] == {
        "live": "2026-11-01T09:00:00+00:00",
        "shadow": "2026-11-01T10:00:00+00:00",
    }
    assert fields["event_date"] == {"live": "2027-06-01", "shadow": None}
    assert fields["confidence"] == {"live": 0.8, "shadow": 0.9}
