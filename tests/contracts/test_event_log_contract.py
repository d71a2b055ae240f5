"""The event log contract (`EventLog`), run unchanged against the in-memory log and Postgres."""

from __future__ import annotations

from datetime import timedelta

from domain.model import KafkaCoordinates
from domain.ports import Appended
from producers.contract import EventType
from tests.contracts.conftest import Stores
from tests.support.builders import BASE_TIME, key_of, make_event


def test_append_is_idempotent_and_keeps_order(stores: Stores) -> None:
    first = [make_event("ada", "one", minutes=2), make_event("ada", "two", minutes=1)]
    appended = stores.events.append([(e, KafkaCoordinates("t", 0, i)) for i, e in enumerate(first)])
    assert appended == Appended(2, 0)
    bob = make_event("bob", "three")
    # The repeat is ignored.
    assert stores.events.append([(first[0], None), (bob, None)]) == Appended(1, 0)
    assert stores.events.append([]) == Appended(0, 0)
    logged = stores.events.user_events(key_of("ada"))
    assert [e.event.event_id for e in logged] == [e.event_id for e in first]  # log order
    assert logged[0].seq < logged[1].seq
    assert logged[0].event == first[0]


def test_user_events_until_a_time(stores: Stores) -> None:
    events = [make_event("ada", f"event {m}", minutes=m) for m in (0, 5, 10)]
    stores.events.append([(e, None) for e in events])
    until = stores.events.user_events(key_of("ada"), until=BASE_TIME + timedelta(minutes=5))
    assert [e.event.content for e in until] == ["event 0", "event 5"]
    assert stores.events.user_events(key_of("nobody")) == []


def test_one_event_id_in_two_organizations_is_two_events(stores: Stores) -> None:
    ours = make_event("ada", "I live in Lisbon")
    theirs = make_event("ada", "I live in Porto", org="org-b").model_copy(
        update={"event_id": ours.event_id}
    )
    assert stores.events.append([(ours, None), (theirs, None)]) == Appended(2, 0)
    assert [e.event.content for e in stores.events.user_events(key_of("ada"))] == [
        "I live in Lisbon"
    ]
    assert [e.event.content for e in stores.events.user_events(key_of("ada", "org-b"))] == [
        "I live in Porto"
    ]


def test_events_an_erasure_forgot_are_not_appended(stores: Stores) -> None:
    stores.cut(key_of("ada"), "t", 0, 5)
    places = ((0, 4), (0, 5), (1, 0))
    at = [(make_event("ada", f"offset {o}"), KafkaCoordinates("t", p, o)) for p, o in places]
    others = [(make_event("ada", "elsewhere", org="org-b"), KafkaCoordinates("t", 0, 1))]
    assert stores.events.append([*at, *others]) == Appended(3, 1)
    kept = [e.event.content for e in stores.events.user_events(key_of("ada"))]
    assert kept == ["offset 5", "offset 0"]  # from the tombstone on, and another partition


def test_an_event_an_erased_fact_came_from_is_appended_redacted(stores: Stores) -> None:
    # Read from Kafka after the fact's erasure: the processor was ahead of the log writer.
    source = make_event("ada", "I live in Lisbon")
    scaffold = make_event(
        "ada", '"Lisbon"', EventType.SCAFFOLD_UPDATE, scaffold_key="City", minutes=1
    )
    other = make_event("ada", "I like tea", minutes=2)
    theirs = source.model_copy(update={"organization_id": "org-b"})  # its id, another memory
    for event in (source, scaffold):
        stores.redact(key_of("ada"), event.event_id)
    assert stores.events.append([(e, None) for e in (source, scaffold, other, theirs)]) == (
        Appended(4, 0)
    )
    contents = [e.event.content for e in stores.events.user_events(key_of("ada"))]
    assert contents == ["[erased]", '"[erased]"', "I like tea"]
    assert [e.event.content for e in stores.events.user_events(key_of("ada", "org-b"))] == [
        "I live in Lisbon"
    ]


def test_a_batch_with_an_event_twice_appends_it_once_at_its_first_place(stores: Stores) -> None:
    one, two = make_event("ada", "one"), make_event("ada", "two")
    batch = [(one, None), (two, None), (one, None)]
    assert stores.events.append(batch) == Appended(2, 0)
    assert stores.events.append(batch) == Appended(0, 0)
    assert [e.event.content for e in stores.events.user_events(key_of("ada"))] == ["one", "two"]


def test_a_large_batch_keeps_every_field_and_the_read_order(stores: Stores) -> None:
    labels = {"session_id": "s", "message_id": "m", "attachment_id": "a", "filename": "f.pdf"}
    events = [
        make_event(
            f"user-{i % 7}",
            f"event {i} \u00e9\t\"'\\ {{}}",
            EventType.TOOL_OUTPUT if i % 2 else EventType.FACT,
            minutes=-i,
            connection_id=f"c{i}" if i % 3 else None,
            **({"tool_id": "gmail", **labels} if i % 2 else {}),
        )
        for i in range(1_500)
    ]
    at = [(e, KafkaCoordinates("t", i % 3, i)) for i, e in enumerate(events)]
    assert stores.events.append(at) == Appended(1_500, 0)
    for u in range(7):
        logged = stores.events.user_events(key_of(f"user-{u}"))
        assert [e.event for e in logged] == events[u::7]
        assert [e.seq for e in logged] == sorted(e.seq for e in logged)
