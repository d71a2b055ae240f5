"""What a run makes of S: the model's scaffold and the keys events set, within its size."""

from __future__ import annotations

import uuid

from domain.model import MemoryState, MemoryUpdate, TokenUsage
from processors.consolidate import Consolidator
from processors.cost import PriceTable
from processors.gate import WriteGate
from processors.schema import (
    MAX_SCAFFOLD_CHARS,
    BackendResponse,
    ConsolidationOutput,
    ConsolidationRequest,
    scaffold_size,
)
from producers.contract import ContextEvent, EventType, Source
from tests.support.builders import BASE_TIME, make_event


def planned(state: MemoryState, event: ContextEvent, output: ConsolidationOutput) -> MemoryUpdate:
    """The run a consolidator plans on `state` for one event and the model's `output`."""
    request = ConsolidationRequest.build(state, (), [event], BASE_TIME)
    return Consolidator(WriteGate(None), PriceTable({})).plan(
        request,
        BackendResponse(output, "{}", TokenUsage(), "offline"),
        run_id=uuid.uuid4(),
        backend="offline",
        prompt_version="v",
        started_at=BASE_TIME,
        duration_ms=0,
    )


def test_a_scaffold_key_an_event_names_wins_its_room_and_what_is_left_out_is_recorded() -> None:
    # The model's S already fills the room; the event's key comes after it in S.
    model_scaffold = {f"Notes {i}": "x" * 6_000 for i in range(4)}
    title = make_event(
        "ada", '"Product designer"', EventType.SCAFFOLD_UPDATE, source=Source.AUTONOMOUS,
        scaffold_key="Title",
    )  # fmt: skip
    state = MemoryState("ada", "org-a", "", {}, (), 0)
    output = ConsolidationOutput(updated_working_memory="", updated_scaffold=model_scaffold)
    update = planned(state, title, output)
    scaffold = dict(update.state.scaffold)
    assert scaffold["Title"] == "Product designer"
    assert scaffold_size(scaffold) <= MAX_SCAFFOLD_CHARS
    run_output = update.run.output or {}
    assert run_output["scaffold_left_out"] == ["Notes 3"]
    assert list(scaffold) == ["Notes 0", "Notes 1", "Notes 2", "Title"]


def test_an_answer_without_a_scaffold_leaves_s_as_it_was() -> None:
    state = MemoryState("ada", "org-a", "", {"Role": "designer", "City": "Lisbon"}, (), 3)
    note = make_event("ada", "I moved to Porto")
    silent = ConsolidationOutput.model_validate({"updated_working_memory": "W"})
    kept = planned(state, note, silent).state
    assert dict(kept.scaffold) == {"Role": "designer", "City": "Lisbon"}
    # S is answered as a merge patch of it: {} changes nothing, a null removes its key.
    unchanged = ConsolidationOutput(updated_working_memory="W", updated_scaffold={})
    assert dict(planned(state, note, unchanged).state.scaffold) == dict(state.scaffold)
    moved = ConsolidationOutput(
        updated_working_memory="W", updated_scaffold={"City": None, "Home": {"city": "Porto"}}
    )
    after = {"Role": "designer", "Home": {"city": "Porto"}}
    assert dict(planned(state, note, moved).state.scaffold) == after


def test_a_scaffold_update_merges_into_the_key_whatever_the_model_made_of_it() -> None:
    state = MemoryState("ada", "org-a", "", {"Team": {"size": 6, "lead": {"since": "2025"}}}, (), 2)
    pod = make_event(
        "ada", '{"pod": "Growth", "lead": {"name": "Priya"}}', EventType.SCAFFOLD_UPDATE,
        source=Source.AUTONOMOUS, scaffold_key="Team",
    )  # fmt: skip
    merged = {"size": 6, "lead": {"since": "2025", "name": "Priya"}, "pod": "Growth"}
    # The model kept S as it was: the event's keys are written into the object.
    kept = ConsolidationOutput(updated_working_memory="", updated_scaffold=dict(state.scaffold))
    assert dict(planned(state, pod, kept).state.scaffold)["Team"] == merged
    # The model left the key out of its patch: S's value is kept, and merged into.
    left = ConsolidationOutput(updated_working_memory="", updated_scaffold={"Role": "PM"})
    assert dict(planned(state, pod, left).state.scaffold) == {"Role": "PM", "Team": merged}
    # A value that is not an object replaces the key's.
    goals = make_event(
        "ada", '["ship onboarding"]', EventType.SCAFFOLD_UPDATE, source=Source.AUTONOMOUS,
        scaffold_key="Team",
    )  # fmt: skip
    assert dict(planned(state, goals, kept).state.scaffold)["Team"] == ["ship onboarding"]
