"""The inbox and tool clients: what they publish, and ids stable exactly when asked for; what
no producer client publishes."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from domain.erasure import REDACTION
from producers.chat import ChatObservations, ChatScope
from producers.contract import MAX_CONTENT_CHARS, ContextEvent, EventType, Source
from producers.corrections import FactCorrections
from producers.inbox import InboxContextUpdates
from producers.tools import ToolContextPublisher


class Published:
    def __init__(self) -> None:
        self.batches: list[list[ContextEvent]] = []

    def publish(self, events: Sequence[ContextEvent]) -> None:
        self.batches.append(list(events))


def test_an_inbox_cycle_publishes_one_batch_with_ids_from_its_cycle() -> None:
    sent = Published()
    inbox = InboxContextUpdates(sent, "ada", "org-a")
    first = inbox.update_user_context({"Role": "Designer"}, ["Pays in EUR"], cycle_id="c1")
    again = inbox.update_user_context({"Role": "Designer"}, ["Pays in EUR"], cycle_id="c1")
    fresh = inbox.update_user_context({"Role": "Designer"}, ["Pays in EUR"])
    assert [e.event_id for e in first] == [e.event_id for e in again]
    assert {e.event_id for e in fresh}.isdisjoint(e.event_id for e in first)
    scaffold, learned = first
    assert (scaffold.event_type, scaffold.scaffold_key, scaffold.content) == (
        EventType.SCAFFOLD_UPDATE,
        "Role",
        '"Designer"',
    )
    assert (learned.event_type, learned.content) == (EventType.LEARNED_FACT, "Pays in EUR")
    assert {(e.user_id, e.organization_id, e.source_metadata.source) for e in first} == {
        ("ada", "org-a", Source.AUTONOMOUS)
    }
    assert scaffold.occurred_at == learned.occurred_at
    assert len(sent.batches) == 3
    assert inbox.update_user_context({}, []) == []
    assert len(sent.batches) == 3  # nothing to say, nothing sent


def test_tool_output_is_chunked_with_ids_stable_when_the_message_is_named() -> None:
    sent = Published()
    tools = ToolContextPublisher(sent, "ada", "org-a")
    text = "\n\n".join(["a" * (MAX_CONTENT_CHARS // 2)] * 3)
    named = tools.index_tool_output(text, tool_id="gmail", message_id="m1")
    again = tools.index_tool_output(text, tool_id="gmail", message_id="m1")
    anonymous = tools.index_tool_output(text, tool_id="gmail")
    assert len(named) == 3  # two halves do not fit in one chunk with their separator
    assert all(len(e.content) <= MAX_CONTENT_CHARS for e in named)
    assert [e.event_id for e in named] == [e.event_id for e in again]
    assert {e.event_id for e in anonymous}.isdisjoint(e.event_id for e in named)
    assert {(e.event_type, e.source_metadata.tool_id) for e in named} == {
        (EventType.TOOL_OUTPUT, "gmail")
    }


def test_connection_context() -> None:
    sent = Published()
    event = ToolContextPublisher(sent, "ada", "org-a").update_connection_context(
        "crm", "Acme is a key account"
    )
    assert (event.event_type, event.source_metadata.connection_id, event.content) == (
        EventType.CONNECTION_UPDATE,
        "crm",
        "Acme is a key account",
    )
    assert sent.batches == [[event]]


def test_an_inbox_cycle_run_again_in_another_order_publishes_the_same_events() -> None:
    inbox = InboxContextUpdates(Published(), "ada", "org-a")
    learned = ["Pays in EUR", "Prefers calls", "Pays in EUR"]
    first = inbox.update_user_context({"Role": "Designer"}, learned, cycle_id="c1")
    again = inbox.update_user_context({"Role": "Designer"}, learned[::-1], cycle_id="c1")
    assert len(first) == 3  # the repeated addition is one event
    assert {e.event_id for e in first} == {e.event_id for e in again}


def test_inbox_and_tool_ids_cannot_be_spelled_by_other_parts() -> None:
    inbox = InboxContextUpdates(Published(), "ada", "org-a")
    (one,) = inbox.update_user_context({"x\x1fscaffold\x1fy": 1}, [], cycle_id="c")
    (two,) = inbox.update_user_context({"y": 1}, [], cycle_id="c\x1fscaffold\x1fx")
    assert one.event_id != two.event_id
    tools = ToolContextPublisher(Published(), "ada", "org-a")
    (a,) = tools.index_tool_output("hi", tool_id="t", message_id="m\x1f", attachment_id="a")
    (b,) = tools.index_tool_output("hi", tool_id="t", message_id="m", attachment_id="\x1fa")
    assert a.event_id != b.event_id


def test_two_connections_messages_of_one_id_are_two_outputs() -> None:
    tools = ToolContextPublisher(Published(), "ada", "org-a")
    (work,) = tools.index_tool_output(
        "Invoice due", tool_id="imap", connection_id="work", message_id="1"
    )
    (home,) = tools.index_tool_output(
        "Dentist at 9", tool_id="imap", connection_id="home", message_id="1"
    )
    (again,) = tools.index_tool_output(
        "Invoice due", tool_id="imap", connection_id="work", message_id="1"
    )
    assert work.event_id != home.event_id
    assert again.event_id == work.event_id


SENDS: dict[str, Callable[[Published, str], Any]] = {
    "chat": lambda p, text: ChatObservations(p, ChatScope("ada", "org-a")).record_observation(
        text, "fact"
    ),
    "inbox learned": lambda p, text: InboxContextUpdates(p, "ada", "org-a").update_user_context(
        {}, [text]
    ),
    "inbox scaffold": lambda p, text: InboxContextUpdates(p, "ada", "org-a").update_user_context(
        {"Role": text}, []
    ),
    "tool output": lambda p, text: ToolContextPublisher(p, "ada", "org-a").index_tool_output(
        text, tool_id="imap"
    ),
    "connection": lambda p, text: ToolContextPublisher(p, "ada", "org-a").update_connection_context(
        "crm", text
    ),
    "correction": lambda p, text: FactCorrections(p, "ada", "org-a").correct_fact(
        uuid.uuid4(), text
    ),
}


@pytest.mark.parametrize("send", SENDS.values(), ids=SENDS.keys())
def test_no_client_publishes_what_an_erasure_writes_over_an_event(
    send: Callable[[Published, str], Any],
) -> None:
    # The pipeline drops a logged event of that text as erased, with no dead letter.
    sent = Published()
    with pytest.raises(ValueError, match="reserved by memoryd"):
        send(sent, REDACTION)
    assert sent.batches == []
    send(sent, f"Ada read {REDACTION} on a form")
    assert len(sent.batches) == 1
