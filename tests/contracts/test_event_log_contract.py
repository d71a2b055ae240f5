"""The event log contract (`EventLog`), run unchanged against the in-memory log and Postgres."""

from __future__ import annotations

from datetime import timedelta

from domain.model import KafkaCoordinates
from tests.contracts.conftest import Stores
from tests.support.builders import BASE_TIME, make_event


def test_append_is_idempotent_and_keeps_order(stores: Stores) -> None:
    first = [make_event("ada", "one", minutes=2), make_event("ada", "two", minutes=1)]
    assert (
        stores.events.append([(e, KafkaCoordinates("t", 0, i)) for i, e in enumerate(first)]) == 2
    )
    bob = make_event("bob", "three")
    assert stores.events.append([(first[0], None), (bob, None)]) == 1  # the repeat is ignored
    assert stores.events.append([]) == 0
    logged = stores.events.user_events("ada")
    assert [e.event.event_id for e in logged] == [e.event_id for e in first]  # log order
    assert logged[0].seq < logged[1].seq
    assert logged[0].event == first[0]


def test_user_events_until_a_time(stores: Stores) -> None:
    events = [make_event("ada", f"event {m}", minutes=m) for m in (0, 5, 10)]
    stores.events.append([(e, None) for e in events])
    until = stores.events.user_events("ada", until=BASE_TIME + timedelta(minutes=5))
    assert [e.event.content for e in until] == ["event 0", "event 5"]
    assert stores.events.user_events("nobody") == []
