"""What a connection has learned is added once: a tool client's update sent again (a new
event, no key) or in other words' spacing or case adds nothing."""

from __future__ import annotations

import uuid

from domain.model import MAX_LEARNED_INFO, MemoryState, TokenUsage
from processors.consolidate import Consolidator
from processors.cost import PriceTable
from processors.gate import WriteGate
from processors.schema import BackendResponse, ConsolidationOutput, ConsolidationRequest
from producers.contract import ContextEvent, EventType, Source
from tests.support.builders import BASE_TIME, key_of, make_event
from tests.support.fakes import FakeConsumer, FlakyBackend, ListDeadLetters
from tests.support.inmemory import TOPIC, InMemoryMemoryd, step_until

MANAGER = "Ada's manager at Acme is Priya."


def update(content: str, minutes: int = 0, connection: str = "gmail-work") -> ContextEvent:
    return make_event(
        "ada", content, EventType.CONNECTION_UPDATE, minutes=minutes, source=Source.TOOL,
        connection_id=connection, tool_id="inbox",
    )  # fmt: skip


def test_a_batch_adds_to_a_connection_only_what_it_does_not_know() -> None:
    events = [
        update(MANAGER),
        update("ada's  manager at ACME is Priya.", 1),  # known already, other spacing and case
        update("Invoices go under Finance/Vendors.", 2),
        update("Invoices go under Finance/Vendors.", 3),  # sent again
        update(MANAGER, 4, connection="slack-acme"),  # another connection's own
    ]
    state = MemoryState("ada", "org-a", "", {}, (), 2)
    request = ConsolidationRequest.build(
        state,
        (),
        events,
        BASE_TIME,
        connections={"gmail-work": (MANAGER,)},
    )
    planned = Consolidator(WriteGate(None), PriceTable({})).plan(
        request,
        BackendResponse(ConsolidationOutput(updated_working_memory=""), "{}", TokenUsage(), "m"),
        run_id=uuid.uuid4(),
        backend="offline",
        prompt_version="v",
        started_at=BASE_TIME,
        duration_ms=0,
    )
    assert dict(planned.connection_additions) == {
        "gmail-work": ("Invoices go under Finance/Vendors.",),
        "slack-acme": (MANAGER,),
    }


def test_a_batch_adds_no_more_than_a_connection_keeps() -> None:
    lines = [f"Rule {i} of the inbox." for i in range(MAX_LEARNED_INFO + 5)]
    events = [update(line, minutes) for minutes, line in enumerate(lines)]
    request = ConsolidationRequest.build(MemoryState("ada", "org-a"), (), events, BASE_TIME)
    planned = Consolidator(WriteGate(None), PriceTable({})).plan(
        request,
        BackendResponse(ConsolidationOutput(updated_working_memory=""), "{}", TokenUsage(), "m"),
        run_id=uuid.uuid4(),
        backend="offline",
        prompt_version="v",
        started_at=BASE_TIME,
        duration_ms=0,
    )
    assert planned.connection_additions == {"gmail-work": tuple(lines[-MAX_LEARNED_INFO:])}


def test_an_update_sent_again_in_a_later_batch_is_learned_once() -> None:
    m, consumer = InMemoryMemoryd(), FakeConsumer(TOPIC)
    processor = m.processor(consumer, FlakyBackend(), ListDeadLetters())
    processor.start()
    for offset, minutes in enumerate((0, 5)):
        event = update(MANAGER, minutes)
        consumer.produce(0, event.to_bytes(), event.kafka_key)
        step_until(processor, lambda n=offset: consumer.committed.get(0) == n + 1)
    processor.shutdown()
    (known,) = m.memory.connections(key_of("ada"), ["gmail-work"])
    assert known.learned_info == (MANAGER,)
