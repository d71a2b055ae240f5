"""The append-only event log in Postgres: written by the log writer, read by replay and audit."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from psycopg_pool import ConnectionPool

from domain.model import KafkaCoordinates, LoggedEvent
from producers.contract import ContextEvent, SourceMetadata
from store.postgres import transaction

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
    event = ContextEvent(
        schema_version=version,
        event_id=event_id,
        user_id=user_id,
        organization_id=org,
        event_type=event_type,
        content=content,
        scaffold_key=scaffold_key,
        source_metadata=SourceMetadata(
            source=source,
            session_id=session_id,
            connection_id=connection_id,
            tool_id=tool_id,
            message_id=message_id,
            attachment_id=attachment_id,
            filename=filename,
        ),
        occurred_at=occurred_at,
    )
    return LoggedEvent(seq=seq, event=event, recorded_at=recorded_at)


class PostgresEventLog:
    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool

    def append(self, events: Sequence[tuple[ContextEvent, KafkaCoordinates | None]]) -> int:
        """Insert in one transaction; returns how many were new (the rest were duplicates)."""
        if not events:
            return 0
        sql = (
            f"INSERT INTO context_events ({_COLUMNS}) VALUES "
            f"({', '.join(['%s'] * 18)}) ON CONFLICT (event_id) DO NOTHING"
        )
        with transaction(self._pool, "event log append") as conn, conn.cursor() as cur:
            cur.executemany(sql, [_row_params(e, at) for e, at in events], returning=False)
            return max(cur.rowcount, 0)

    def user_events(
        self, user_id: str, *, until: datetime | None = None
    ) -> list[LoggedEvent[ContextEvent]]:
        sql = (
            f"{_SELECT} WHERE user_id = %s"
            " AND (%s::timestamptz IS NULL OR occurred_at <= %s) ORDER BY seq"
        )
        with transaction(self._pool) as conn:
            rows = conn.execute(sql, (user_id, until, until)).fetchall()
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

    def users(self) -> list[str]:
        with transaction(self._pool) as conn:
            return [
                r[0] for r in conn.execute("SELECT DISTINCT user_id FROM context_events ORDER BY 1")
            ]

    def count(self, user_id: str | None = None) -> int:
        with transaction(self._pool) as conn:
            row = conn.execute(
                "SELECT count(*) FROM context_events WHERE %s::text IS NULL OR user_id = %s",
                (user_id, user_id),
            ).fetchone()
        return int(row[0]) if row else 0

    def unconsolidated(self, user_id: str | None = None) -> list[uuid.UUID]:
        with transaction(self._pool) as conn:
            rows = conn.execute(
                "SELECT event_id FROM context_events_status WHERE NOT processed"
                " AND (%s::text IS NULL OR user_id = %s) ORDER BY seq",
                (user_id, user_id),
            ).fetchall()
        return [r[0] for r in rows]

    def erase_user(self, user_id: str, *, actor: str, reason: str) -> int:
        with transaction(self._pool) as conn:
            row = conn.execute(
                "SELECT erase_user_events(%s, %s, %s)", (user_id, actor, reason)
            ).fetchone()
        return int(row[0]) if row else 0
