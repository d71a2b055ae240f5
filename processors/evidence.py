"""Where a fact comes from: the evidence events behind a proposal, and what its provenance
(connection, source, the events themselves) is made of."""

from __future__ import annotations

import re
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from domain.model import Provenance
from processors.schema import Observation
from producers.contract import ContextEvent

_WORD = re.compile(r"[a-z0-9]+")


def provenance_of(events: Sequence[ContextEvent]) -> Provenance:
    """A new fact's provenance from its evidence events (at least one)."""
    first = scope_source(events)
    meta = first.source_metadata
    return Provenance(
        context_type=first.event_type.value,
        source=meta.source.value,
        connection_id=meta.connection_id,
        tool_id=meta.tool_id,
        message_id=meta.message_id,
        attachment_id=meta.attachment_id,
        filename=meta.filename,
        source_event_ids=tuple(e.event_id for e in events),
    )


def scope_source(events: Sequence[ContextEvent]) -> ContextEvent:
    """The evidence event a new fact takes its connection (and the rest of its source) from,
    whatever order the backend listed the evidence in.

    What was learned inside a connection is shown only while it is active, as in W and S: a
    fact drawing on any observation made in a connection is that connection's, even if other
    evidence carries none. Evidence from several connections goes to the one most of it comes
    from, ties by name: never to none, which would show each connection's knowledge in the
    others' turns. Without a connection the first listed event is the source, as before.
    """
    scoped = [e for e in events if e.source_metadata.connection_id is not None]
    if not scoped:
        return events[0]
    counts = Counter(e.source_metadata.connection_id for e in scoped)
    chosen = min(counts, key=lambda c: (-counts[c], c or ""))
    return next(e for e in scoped if e.source_metadata.connection_id == chosen)


def merge_evidence(provenance: Provenance, event_ids: tuple[uuid.UUID, ...]) -> Provenance:
    merged = tuple(dict.fromkeys((*provenance.source_event_ids, *event_ids)))
    return replace(provenance, source_event_ids=merged)


def closest_observation(content: str, observations: Sequence[Observation]) -> ContextEvent:
    """The observation sharing most words with `content`, for facts that cite no evidence."""
    words = set(_WORD.findall(content.lower()))

    def overlap(o: Observation) -> int:
        return len(words & set(_WORD.findall(o.event.content.lower())))

    return max(observations, key=overlap).event
