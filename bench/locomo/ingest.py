"""LoCoMo dialogue through the real pipeline, and questions through the real read path.

One `ContextEvent` per turn (event_type fact, user = the conversation's sample_id, occurred_at
= the session's time, message_id = the turn's dia_id) is published to Kafka; the log writer
and the MemoryProcessor consume it as in production until every event is consolidated and
every fact indexed. A question is then asked through `ContextService.assemble`, and each
returned fact is traced back to turns: fact → source_event_ids → logged event → message_id.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bench.locomo.dataset import Conversation, Question, Turn
from domain.ids import MemoryKey
from memoryd import wiring
from memoryd.ops.topics import ensure_topics
from memoryd.settings import Settings
from producers.contract import ContextEvent, EventType, Source, SourceMetadata, new_event_id
from store.read.ranking import Budget

ORGANIZATION = "locomo"
DEGRADED_TRIES = 3


class IngestError(RuntimeError):
    """The pipeline did not consolidate or index everything it was given."""


def turn_event(sample_id: str, turn: Turn) -> ContextEvent:
    return ContextEvent(
        # Stable per turn: the turn is the idempotency key, as a chat service's message is.
        event_id=new_event_id(f"locomo:{sample_id}:{turn.dia_id}"),
        user_id=sample_id,
        organization_id=ORGANIZATION,
        event_type=EventType.FACT,
        content=turn.content,
        source_metadata=SourceMetadata(
            source=Source.INTERACTIVE,
            session_id=f"{sample_id}:session_{turn.session}",
            message_id=turn.dia_id,
        ),
        occurred_at=turn.occurred_at,
    )


@dataclass(frozen=True)
class IngestReport:
    turns: int
    events_logged: int
    facts_by_status: dict[str, int]
    facts_per_user: dict[str, int]  # active facts
    runs: int
    publish_s: float
    total_s: float  # publish start → every event consolidated and every fact indexed


def ingest(
    settings: Settings, conversations: Sequence[Conversation], timeout_s: float
) -> IngestReport:
    events = [turn_event(c.sample_id, t) for c in conversations for t in c.turns]
    ensure_topics(settings)
    started = time.perf_counter()
    publisher = wiring.publisher(settings)
    try:
        publisher.publish(events)
    finally:
        publisher.close()
    published = time.perf_counter()
    with wiring.core(settings) as c:
        writer = wiring.log_writer(c)
        writer_thread = threading.Thread(
            target=writer.drain,
            kwargs={"idle_s": 3.0, "deadline_s": timeout_s},
            name="locomo-log-writer",
            daemon=True,
        )
        writer_thread.start()
        wiring.processor(c).run_until_idle(idle_s=3.0, deadline_s=timeout_s)
        writer_thread.join(timeout=timeout_s)
        if writer_thread.is_alive():
            raise IngestError("the log writer did not finish")
        # Facts a failed Chroma upsert left pending would be invisible to retrieval.
        wiring.indexer(c).drain_pending()
        elapsed = time.perf_counter() - started
        _check_complete(c, len(events))
        return IngestReport(
            turns=len(events),
            events_logged=c.events.count(),
            facts_by_status=_count(c, "SELECT status, count(*) FROM memory_facts GROUP BY 1"),
            facts_per_user=_count(
                c,
                "SELECT user_id, count(*) FROM memory_facts WHERE status = 'active' GROUP BY 1",
            ),
            runs=_count(c, "SELECT status, count(*) FROM consolidation_runs GROUP BY 1").get(
                "succeeded", 0
            ),
            publish_s=published - started,
            total_s=elapsed,
        )


def _check_complete(c: wiring.Core, expected: int) -> None:
    logged = c.events.count()
    pending = c.events.unconsolidated()
    unindexed = c.memory.pending_index(limit=10)
    if logged != expected or pending or unindexed:
        raise IngestError(
            f"{expected} events published, {logged} logged, {len(pending)} not consolidated, "
            f"{len(unindexed)}+ facts not indexed"
        )


def _count(c: wiring.Core, query: str) -> dict[str, int]:
    with c.pool.connection() as conn:
        return {str(k): int(n) for k, n in conn.execute(query).fetchall()}


@dataclass(frozen=True)
class Retrieval:
    question: Question
    ranked: tuple[frozenset[str], ...]  # the turns behind each returned fact, best first
    facts_returned: int
    latency_ms: float
    sizes: tuple[int, ...] = ()  # characters of each returned fact's text, best first
    stages_ms: Mapping[str, float] = field(default_factory=dict)  # assemble's own laps
    degraded: bool = False  # still degraded after DEGRADED_TRIES: scored as it came


def ask(
    settings: Settings, questions: Sequence[Question], k: int, budget: Budget = Budget.DEEP
) -> list[Retrieval]:
    """Ask every question; keep each bundle's facts as turn sets (k: the deepest hit@k)."""
    out = []
    with wiring.core(settings) as c, wiring.read_path(c) as service:
        turn_of = _turns_by_event(c, sorted({q.sample_id for q in questions}))
        for q in questions:
            key = MemoryKey(ORGANIZATION, q.sample_id)
            for attempt in range(DEGRADED_TRIES):
                # A degraded bundle (the vector index away a moment) is asked again, not
                # scored as a miss; one that stays so is scored as it came, and counted.
                time.sleep(attempt * 0.5)
                started = time.perf_counter()
                bundle = service.assemble(key, q.question, budget=budget)
                latency_ms = (time.perf_counter() - started) * 1000
                if not bundle.degraded:
                    break
            # Every returned fact: the top k score hit@k, all of them the character budget.
            ranked = tuple(
                frozenset(turn_of[e] for e in r.fact.provenance.source_event_ids if e in turn_of)
                for r in bundle.facts
            )
            sizes = tuple(len(r.fact.content) for r in bundle.facts)
            out.append(
                Retrieval(
                    q,
                    ranked,
                    len(bundle.facts),
                    latency_ms,
                    sizes,
                    bundle.timings_ms,
                    degraded=bundle.degraded,
                )
            )
    return out


def _turns_by_event(c: wiring.Core, users: Sequence[str]) -> dict[uuid.UUID, str]:
    """event_id → dia_id, read back from the event log (the message_id the event carried)."""
    out: dict[uuid.UUID, str] = {}
    for user in users:
        for logged in c.events.user_events(MemoryKey(ORGANIZATION, user)):
            message_id = logged.event.source_metadata.message_id
            if message_id is not None:
                out[logged.event.event_id] = message_id
    return out
