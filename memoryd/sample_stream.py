"""The bundled sample stream: a few days of four people's context events, always the same.

The events are built by the producers' own clients (chat, inbox, tools) against a recording
publisher, then restamped: ids become UUID5 of (seed, position) and times follow a seeded
timeline from a fixed date, so a given seed yields byte-identical JSON on every machine.
Regenerate the bundled file with `python -m memoryd.sample_stream`.
"""

from __future__ import annotations

import argparse
import random
import uuid
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from consumers.decoding import Rejected, decode_event
from memoryd.sample_content import PERSONAS, Inbox, Line, Note, Persona, Say, Tool
from producers.chat import ChatObservations, ChatScope
from producers.contract import ContextEvent
from producers.inbox import InboxContextUpdates
from producers.tools import ToolContextPublisher

SAMPLE_START = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
SAMPLE_DAYS = 4
WORKDAY_MINUTES = 10 * 60
SAMPLE_NAMESPACE = uuid.UUID("5d3f6c1e-7a2b-4e8f-9c0d-1b2a3c4d5e6f")
BUNDLED_SAMPLE = Path(__file__).resolve().parent / "data" / "sample_events.jsonl"


class _Recorder:
    """An `EventPublisher` that keeps what it is given instead of sending it."""

    def __init__(self) -> None:
        self.events: list[ContextEvent] = []

    def publish(self, events: Sequence[ContextEvent]) -> None:
        self.events.extend(events)


def _timeline(rng: random.Random, count: int) -> list[datetime]:
    """`count` strictly increasing times spread over the sample's days, in working hours."""
    times: list[datetime] = []
    for day in range(SAMPLE_DAYS):
        on_day = sum(1 for i in range(count) if i * SAMPLE_DAYS // count == day)
        minutes = sorted(rng.sample(range(WORKDAY_MINUTES), on_day))
        start = SAMPLE_START + timedelta(days=day)
        times += [start + timedelta(minutes=m) for m in minutes]
    return times


def _record(recorder: _Recorder, persona: Persona, line: Line, n: int, day: int) -> None:
    user, org = persona.user_id, persona.organization_id
    tools = ToolContextPublisher(recorder, user, org)
    if isinstance(line, Say):
        scope = ChatScope(
            user, org, session_id=f"{user}.chat.day{day}", connection_id=line.connection_id
        )
        ChatObservations(recorder, scope).record_observation(
            line.text, line.category, message_id=f"{user}.msg.{n}"
        )
    elif isinstance(line, Inbox):
        InboxContextUpdates(recorder, user, org).update_user_context(
            line.scaffold, line.learned, cycle_id=f"{user}.inbox.{n}"
        )
    elif isinstance(line, Tool):
        tools.index_tool_output(
            line.text,
            tool_id=line.tool_id,
            connection_id=line.connection_id,
            message_id=f"{user}.tool.{n}",
            attachment_id=line.attachment_id,
            filename=line.filename,
        )
    elif isinstance(line, Note):
        tools.update_connection_context(line.connection_id, line.text)


def _persona_events(persona: Persona, seed: int) -> list[tuple[datetime, ContextEvent]]:
    rng = random.Random(f"{seed}:{persona.user_id}")
    times = _timeline(rng, len(persona.script))
    out: list[tuple[datetime, ContextEvent]] = []
    for n, (line, at) in enumerate(zip(persona.script, times, strict=True)):
        recorder = _Recorder()
        _record(recorder, persona, line, n, (at - SAMPLE_START).days)
        # One call can publish several events (an inbox cycle, a chunked attachment): a second
        # apart, so their order survives any sort by time.
        out += [(at + timedelta(seconds=i), e) for i, e in enumerate(recorder.events)]
    return out


def generate_sample_events(seed: int = 7) -> list[ContextEvent]:
    """The sample stream for `seed`, in the order a single Kafka consumer would see it."""
    timed = [pair for persona in PERSONAS for pair in _persona_events(persona, seed)]
    timed.sort(key=lambda pair: (pair[0], pair[1].user_id))
    return [
        event.model_copy(
            update={
                "event_id": uuid.uuid5(SAMPLE_NAMESPACE, f"{seed}:{index}"),
                "occurred_at": at,
            }
        )
        for index, (at, event) in enumerate(timed)
    ]


def write_jsonl(events: Iterable[ContextEvent], path: Path) -> None:
    """One event's contract JSON per line, as the producers put it on the wire."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(event.to_bytes() + b"\n" for event in events))


def read_jsonl(path: Path) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw bytes) per non-blank line; decoding is the consumer's job,
    so a bad line can be reported by its number instead of stopping the read."""
    with path.open("rb") as lines:
        for number, line in enumerate(lines, start=1):
            raw = line.rstrip(b"\r\n")
            if raw.strip():
                yield number, raw


def read_events(path: Path) -> tuple[list[ContextEvent], list[str]]:
    """The events of a JSONL file, and for each line that is not one, `path:line: reason`,
    judged as the log writer judges a record (its dead letters carry the same reasons)."""
    events: list[ContextEvent] = []
    problems: list[str] = []
    for number, raw in read_jsonl(path):
        found = decode_event(raw)
        if isinstance(found, Rejected):
            problems.append(f"{path}:{number}: {found.reason}")
        else:
            events.append(found)
    return events, problems


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Regenerate the bundled sample stream.")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("path", nargs="?", type=Path, default=BUNDLED_SAMPLE)
    args = parser.parse_args(argv)
    write_jsonl(generate_sample_events(args.seed), args.path)


if __name__ == "__main__":
    main()
