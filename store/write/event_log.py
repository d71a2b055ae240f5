"""The append-only event log in Postgres: written by the log writer, read by replay and audit."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterator, Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from domain.erasure import REDACTED_JSON, REDACTION
from domain.ids import NO_CONNECTION, MemoryKey, SubjectHasher
from domain.model import KafkaCoordinates, LoggedEvent
from domain.ports import Appended
from producers.contract import FROM_LOG, ContextEvent, EventType, SourceMetadata
from store.postgres import streamed, transaction
from store.write.locks import log_lock_key

_COLUMNS = (
    "event_id, schema_version, user_id, organization_id, event_type, content, scaffold_key, "
    "source, session_id, connection_id, tool_id, message_id, attachment_id, filename, "
    "occurred_at, kafka_topic, kafka_partition, kafka_offset"
)
_SELECT = (
    "SELECT seq, event_id, schema_version, user_id, organization_id, event_type, content, "
    "scaffold_key, source, session_id, connection_id, tool_id, message_id, attachment_id, "
    "filename, occurred_at, recorded_at FROM context_events"
)


def _row_params(event: ContextEvent, at: KafkaCoordinates | None) -> tuple[Any, ...]:
    m = event.source_metadata
    return (
        event.event_id,
        event.schema_version,
        event.user_id,
        event.organization_id,
        event.event_type.value,
        event.content,
        event.scaffold_key,
        m.source.value,
        m.session_id,
        m.connection_id,
        m.tool_id,
        m.message_id,
        m.attachment_id,
        m.filename,
        event.occurred_at,
        None if at is None else at.topic,
        None if at is None else at.partition,
        None if at is None else at.offset,
    )


def _event_from_row(row: tuple[Any, ...]) -> LoggedEvent[ContextEvent]:
    (
        seq,
        event_id,
        version,
        user_id,
        org,
        event_type,
        content,
        scaffold_key,
        source,
        session_id,
        connection_id,
        tool_id,
        message_id,
        attachment_id,
        filename,
        occurred_at,
        recorded_at,
    ) = row
    # A logged event's content may be what an erasure wrote over its text, which the contract
    # refuses from a producer.
    fields = {
        "schema_version": version,
        "event_id": event_id,
        "user_id": user_id,
        "organization_id": org,
        "event_type": event_type,
        "content": content,
        "scaffold_key": scaffold_key,
        "source_metadata": SourceMetadata(
            source=source,
            session_id=session_id,
            # Logged before the contract reserved it, the sentinel was no connection already:
            # its facts took the ids of facts outside every connection (`fact_id_for`).
            connection_id=None if connection_id == NO_CONNECTION else connection_id,
            tool_id=tool_id,
            message_id=message_id,
            attachment_id=attachment_id,
            filename=filename,
        ),
        "occurred_at": occurred_at,
    }
    event = ContextEvent.model_validate(fields, context=FROM_LOG)
    return LoggedEvent(seq=seq, event=event, recorded_at=recorded_at)


# The most memories one append transaction locks. Advisory locks take slots of Postgres's
# shared lock table (max_locks_per_transaction x max_connections: 6,400 by default), and one
# poll of the log writer (5,000 records) can hold as many memories; several writers at once
# would run it out ("out of shared memory"). A batch over more memories is appended in
# several transactions, in its order: a crash between them leaves a prefix logged, and the
# redelivered batch inserts only the rest (duplicates insert nothing).
MAX_MEMORIES_PER_TRANSACTION = 500

Located = tuple[ContextEvent, KafkaCoordinates | None]


class PostgresEventLog:
    def __init__(
        self,
        pool: ConnectionPool,
        subjects: SubjectHasher,
        max_memories_per_transaction: int = MAX_MEMORIES_PER_TRANSACTION,
    ) -> None:
        if max_memories_per_transaction < 1:
            raise ValueError("an append transaction must be allowed at least one memory")
        self._pool = pool
        self._subjects = subjects
        self._max_memories = max_memories_per_transaction

    def append(self, events: Sequence[Located]) -> Appended:
        """Insert the events no erasure forgot, in their order; duplicates insert nothing.

        One transaction per `MAX_MEMORIES_PER_TRANSACTION` memories of the batch (above). An
        event of a forgotten memory read from Kafka before its tombstone (a lagging writer, a
        new group reading from offset 0) is left out. The memories' log locks, taken shared,
        order this insert against an erasure of any of them: either the erasure waits and then
        deletes what this inserted, or this waits and then sees the cut-offs.
        """
        inserted = forgotten = 0
        for part in memory_bounded_parts(events, self._max_memories):
            appended = self._append_part(part)
            inserted += appended.inserted
            forgotten += appended.forgotten
        return Appended(inserted, forgotten)

    def _append_part(self, events: Sequence[Located]) -> Appended:
        if not events:
            return Appended(0, 0)
        keys = [MemoryKey(*k) for k in sorted({(e.organization_id, e.user_id) for e, _ in events})]
        with transaction(self._pool, "event log append") as conn, conn.cursor() as cur:
            cur.execute(
                "SELECT pg_advisory_xact_lock_shared(k) FROM unnest(%s::bigint[]) AS k",
                ([log_lock_key(k) for k in keys],),
            )
            subjects = {self._subjects(k): k for k in keys}
            cutoffs = _cutoffs(cur, subjects)
            kept = (
                [(e, at) for e, at in events if not _forgotten(e, at, cutoffs)]
                if cutoffs
                else events
            )
            redacted = _redacted(cur, subjects, [e for e, _ in kept])
            if redacted:
                kept = [(_redact(e) if _id(e) in redacted else e, at) for e, at in kept]
            inserted = _copy_insert(cur, kept) if kept else 0
            return Appended(inserted, len(events) - len(kept))

    def user_events(
        self, key: MemoryKey, *, until: datetime | None = None
    ) -> list[LoggedEvent[ContextEvent]]:
        sql = (
            f"{_SELECT} WHERE organization_id = %s AND user_id = %s"
            " AND (%s::timestamptz IS NULL OR occurred_at <= %s) ORDER BY seq"
        )
        with transaction(self._pool) as conn:
            rows = conn.execute(sql, (key.organization_id, key.user_id, until, until)).fetchall()
        return [_event_from_row(r) for r in rows]

    def iter_user_events(self, key: MemoryKey) -> Iterator[LoggedEvent[ContextEvent]]:
        """The memory's events in log order, read as they are used (`store.postgres.streamed`)."""
        rows = streamed(
            self._pool,
            f"{_SELECT} WHERE organization_id = %s AND user_id = %s ORDER BY seq",
            (key.organization_id, key.user_id),
            "event log read",
        )
        return map(_event_from_row, rows)

    def events_with_ids(
        self, key: MemoryKey, event_ids: Collection[uuid.UUID]
    ) -> list[LoggedEvent[ContextEvent]]:
        """These events of the memory that the log holds, in log order."""
        if not event_ids:
            return []
        with transaction(self._pool) as conn:
            rows = conn.execute(
                f"{_SELECT} WHERE organization_id = %s AND user_id = %s AND event_id = ANY(%s)"
                " ORDER BY seq",
                (key.organization_id, key.user_id, list(event_ids)),
            ).fetchall()
        return [_event_from_row(r) for r in rows]

    def iter_all(self, batch: int = 1_000) -> Iterator[LoggedEvent[ContextEvent]]:
        """Every event in log order, read in key-set pages so memory stays flat."""
        last = 0
        while True:
            with transaction(self._pool) as conn:
                rows = conn.execute(
                    f"{_SELECT} WHERE seq > %s ORDER BY seq LIMIT %s", (last, batch)
                ).fetchall()
            if not rows:
                return
            for row in rows:
                yield _event_from_row(row)
            last = rows[-1][0]

    def memories(self) -> list[MemoryKey]:
        with transaction(self._pool) as conn:
            rows = conn.execute(
                "SELECT DISTINCT organization_id, user_id FROM context_events ORDER BY 1, 2"
            ).fetchall()
        return [MemoryKey(r[0], r[1]) for r in rows]

    def count(self, key: MemoryKey | None = None) -> int:
        org, user = (None, None) if key is None else (key.organization_id, key.user_id)
        with transaction(self._pool) as conn:
            row = conn.execute(
                "SELECT count(*) FROM context_events WHERE %s::text IS NULL"
                " OR (organization_id = %s AND user_id = %s)",
                (org, org, user),
            ).fetchone()
        return int(row[0]) if row else 0

    def unconsolidated(self, key: MemoryKey | None = None) -> list[uuid.UUID]:
        org, user = (None, None) if key is None else (key.organization_id, key.user_id)
        with transaction(self._pool) as conn:
            rows = conn.execute(
                "SELECT event_id FROM context_events_status WHERE NOT processed"
                " AND (%s::text IS NULL OR (organization_id = %s AND user_id = %s)) ORDER BY seq",
                (org, org, user),
            ).fetchall()
        return [r[0] for r in rows]


def memory_bounded_parts(events: Sequence[Located], limit: int) -> list[Sequence[Located]]:
    """`events` cut, in order, into runs of at most `limit` distinct memories each."""
    parts: list[Sequence[Located]] = []
    start, seen = 0, set[tuple[str, str]]()
    for i, (event, _) in enumerate(events):
        memory = (event.organization_id, event.user_id)
        if memory not in seen and len(seen) == limit:
            parts.append(events[start:i])
            start, seen = i, set()
        seen.add(memory)
    parts.append(events[start:])
    return parts


# COPY cannot skip conflicts, so a batch is copied into a per-session staging table (emptied
# at every commit) and moved from there with ON CONFLICT DO NOTHING, in Kafka order (`n`) so
# `seq` keeps the order the events were read in. One COPY and one INSERT instead of a
# statement per event: bench.ingest, "Ingest" in BENCHMARKS.md.
_STAGING = "context_events_incoming"
_STAGING_TYPES = (
    "integer", "uuid", "smallint", "text", "text", "text", "text", "text", "text", "text",
    "text", "text", "text", "text", "text", "timestamptz", "text", "integer", "bigint",
)  # fmt: skip
_STAGING_DDL = (
    f"CREATE TEMP TABLE IF NOT EXISTS {_STAGING} ("
    + ", ".join(
        f"{name} {kind}"
        for name, kind in zip(["n", *_COLUMNS.split(", ")], _STAGING_TYPES, strict=True)
    )
    + ") ON COMMIT DELETE ROWS"
)


def _copy_insert(
    cur: psycopg.Cursor[Any], events: Sequence[tuple[ContextEvent, KafkaCoordinates | None]]
) -> int:
    """Insert `events` in their order, skipping those already logged; the number inserted."""
    cur.execute(_STAGING_DDL)
    with cur.copy(f"COPY {_STAGING} (n, {_COLUMNS}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(_STAGING_TYPES)
        for n, (event, at) in enumerate(events):
            copy.write_row((n, *_row_params(event, at)))
    cur.execute(
        f"INSERT INTO context_events ({_COLUMNS}) SELECT {_COLUMNS} FROM {_STAGING} ORDER BY n"
        " ON CONFLICT (organization_id, user_id, event_id) DO NOTHING"
    )
    return max(cur.rowcount, 0)


def _key(event: ContextEvent) -> MemoryKey:
    return MemoryKey(event.organization_id, event.user_id)


Cutoffs = dict[MemoryKey, dict[tuple[str, int], int]]


def _cutoffs(cur: psycopg.Cursor[Any], subjects: dict[str, MemoryKey]) -> Cutoffs:
    cur.execute(
        "SELECT subject, topic, partition, cutoff FROM memory_cutoffs WHERE subject = ANY(%s)",
        (list(subjects),),
    )
    out: Cutoffs = {}
    for subject, topic, partition, cutoff in cur.fetchall():
        out.setdefault(subjects[subject], {})[(topic, partition)] = cutoff
    return out


def _id(event: ContextEvent) -> tuple[MemoryKey, uuid.UUID]:
    return _key(event), event.event_id


def _redacted(
    cur: psycopg.Cursor[Any], subjects: dict[str, MemoryKey], events: Sequence[ContextEvent]
) -> set[tuple[MemoryKey, uuid.UUID]]:
    """Which of `events` an erased fact came from (migration 0014): stored redacted."""
    if not events:
        return set()
    cur.execute(
        "SELECT subject, event_id FROM redacted_events"
        " WHERE subject = ANY(%s) AND event_id = ANY(%s)",
        (list(subjects), list({e.event_id for e in events})),
    )
    return {(subjects[subject], event_id) for subject, event_id in cur.fetchall()}


def _redact(event: ContextEvent) -> ContextEvent:
    """The event with its content as erase_fact leaves a logged one's."""
    scaffold = event.event_type is EventType.SCAFFOLD_UPDATE
    return event.model_copy(update={"content": REDACTED_JSON if scaffold else REDACTION})


def _forgotten(event: ContextEvent, at: KafkaCoordinates | None, cutoffs: Cutoffs) -> bool:
    if at is None:
        return False  # not read from Kafka: nothing to place before or after a tombstone
    cutoff = cutoffs.get(_key(event), {}).get((at.topic, at.partition))
    return cutoff is not None and at.offset < cutoff
