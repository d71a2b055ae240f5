from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from memoryd.sample_stream import (
    BUNDLED_SAMPLE,
    SAMPLE_START,
    generate_sample_events,
    read_jsonl,
    write_jsonl,
)
from producers.contract import ContextEvent, EventType, Source


@pytest.fixture(scope="module")
def events() -> list[ContextEvent]:
    return generate_sample_events()


def test_bundled_file_is_a_fresh_generation(tmp_path: Path, events: list[ContextEvent]) -> None:
    fresh = tmp_path / "sample.jsonl"
    write_jsonl(events, fresh)
    assert BUNDLED_SAMPLE.read_bytes() == fresh.read_bytes(), (
        "the bundled sample drifted: regenerate it with `python -m memoryd.sample_stream`"
    )


def test_generation_is_deterministic_per_seed(events: list[ContextEvent]) -> None:
    assert generate_sample_events(7) == events
    other = generate_sample_events(8)
    assert {e.event_id for e in other}.isdisjoint({e.event_id for e in events})
    assert sorted(e.content for e in other) == sorted(e.content for e in events)


def test_read_jsonl_gives_line_numbers_and_raw_bytes(
    tmp_path: Path, events: list[ContextEvent]
) -> None:
    path = tmp_path / "s.jsonl"
    write_jsonl(events[:3], path)
    path.write_bytes(path.read_bytes() + b"\nnot json\n")
    lines = list(read_jsonl(path))
    assert [n for n, _ in lines] == [1, 2, 3, 5]
    assert [ContextEvent.from_bytes(raw) for _, raw in lines[:3]] == events[:3]
    assert lines[3][1] == b"not json"


def test_stream_is_large_and_varied_enough(events: list[ContextEvent]) -> None:
    users = Counter(e.user_id for e in events)
    assert len(events) >= 200
    assert len(users) >= 3
    assert min(users.values()) >= 40
    assert len({e.organization_id for e in events}) >= 2
    assert len({e.event_id for e in events}) == len(events)


def test_stream_is_ordered_in_time_over_a_few_days(events: list[ContextEvent]) -> None:
    times = [e.occurred_at for e in events]
    assert times == sorted(times)
    assert times[0] >= SAMPLE_START
    assert (times[-1] - times[0]).days >= 2
    for user in {e.user_id for e in events}:
        own = [e.occurred_at for e in events if e.user_id == user]
        assert len(own) == len(set(own)), "one user's events must have a strict order"


def test_every_kind_the_pipeline_handles_is_present(events: list[ContextEvent]) -> None:
    kinds = {e.event_type for e in events}
    # A retraction names a stored fact's id, which only a user looking at memory (the API)
    # knows; a generated stream has none.
    assert kinds == set(EventType) - {EventType.FACT_RETRACTION}
    assert {e.source_metadata.source for e in events} == set(Source)
    autonomous = {e.event_type for e in events if e.source_metadata.source is Source.AUTONOMOUS}
    assert autonomous == {EventType.SCAFFOLD_UPDATE, EventType.LEARNED_FACT}
    assert any(e.event_type is EventType.FACT and e.source_metadata.connection_id for e in events)
    assert any(
        e.event_type is EventType.TOOL_OUTPUT
        and e.source_metadata.attachment_id
        and e.source_metadata.filename
        for e in events
    )


def test_the_designer_moves_from_engineering_to_design(events: list[ContextEvent]) -> None:
    maya = [e for e in events if e.user_id == "maya.okafor"]
    said = [i for i, e in enumerate(maya) if "I work in engineering" in e.content]
    corrected = [
        i
        for i, e in enumerate(maya)
        if e.event_type is EventType.CORRECTION and "design" in e.content
    ]
    assert said
    assert corrected
    assert said[0] < corrected[0]
