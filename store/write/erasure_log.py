"""The audited erase path in Postgres: the erasure audit, its cut-offs, and the erase functions.

An erasure is a row of `erasure_audit` before anything is removed, and it moves through
`ErasureStatus` one durable step at a time, so a crash anywhere leaves a row that says what is
left to do. The memory's ids stay in `erasure_pending` only until the erasure completes; the
audit row keeps a keyed digest of them, never the ids. Removing rows is one call of
`erase_memory` or `erase_fact` (migration 0004), one transaction that records its counts in
the audit row; the append-only logs let only those functions through.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from domain.erasure import ErasureReceipt, ErasureScope, ErasureStatus, TombstoneAt, seal
from domain.ids import MemoryKey
from store.errors import StoreError
from store.postgres import transaction
from store.write.locks import erasure_lock_key, log_lock_key

_AUDIT_COLUMNS = (
    "a.erasure_id, a.scope, a.subject, a.status, a.tombstone_topic, a.tombstone_partition,"
    " a.tombstone_offset, a.removed, a.digest, a.requested_at, a.erased_at"
)

# The erasure of a memory (or of one of its facts) started and not completed, if any.
_OPEN_ERASURE = (
    f"SELECT {_AUDIT_COLUMNS} FROM erasure_audit a JOIN erasure_pending p USING (erasure_id)"
    " WHERE a.subject = %s AND a.scope = %s AND a.status <> 'completed'"
    " AND p.fact_id IS NOT DISTINCT FROM %s ORDER BY a.id LIMIT 1"
)


@dataclass(frozen=True)
class OpenErasures:
    count: int
    oldest_age_s: float  # 0 when none is open


@dataclass(frozen=True)
class ErasureRecord:
    """One erasure as audited: where it stands, and what it removed so far."""

    erasure_id: uuid.UUID
    scope: ErasureScope
    subject: str
    status: ErasureStatus
    tombstone: TombstoneAt | None
    removed: Mapping[str, Any]
    digest: str | None
    requested_at: datetime
    erased_at: datetime | None

    def receipt(self) -> ErasureReceipt:
        return seal(self.erasure_id, self.scope, self.subject, self.tombstone, self.removed)


@dataclass(frozen=True)
class PendingErasure:
    """An erasure not completed, with the ids needed to finish it."""

    record: ErasureRecord
    key: MemoryKey
    fact_id: uuid.UUID | None


def _record(row: tuple[Any, ...]) -> ErasureRecord:
    (erasure_id, scope, subject, status, topic, partition, offset, removed, digest) = row[:9]
    requested_at, erased_at = row[9:11]
    tombstone = None if topic is None else TombstoneAt(topic, partition, offset)
    return ErasureRecord(
        erasure_id,
        ErasureScope(scope),
        subject,
        ErasureStatus(status),
        tombstone,
        removed,
        digest,
        requested_at,
        erased_at,
    )


class PostgresErasureLog:
    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool

    # -- finding an erasure ---------------------------------------------------------------

    def get(self, erasure_id: uuid.UUID) -> ErasureRecord | None:
        with self._transaction() as conn:
            row = conn.execute(
                f"SELECT {_AUDIT_COLUMNS} FROM erasure_audit a WHERE a.erasure_id = %s",
                (erasure_id,),
            ).fetchone()
        return None if row is None else _record(row)

    def open_erasure(
        self, subject: str, scope: ErasureScope, fact_id: uuid.UUID | None
    ) -> ErasureRecord | None:
        """The erasure of this memory (or fact) started and not completed, if any."""
        with self._transaction() as conn:
            row = conn.execute(_OPEN_ERASURE, (subject, scope.value, fact_id)).fetchone()
        return None if row is None else _record(row)

    def latest(self, subject: str, scope: ErasureScope) -> ErasureRecord | None:
        """The most recent erasure of a memory (or of its facts), open or completed."""
        with self._transaction() as conn:
            row = conn.execute(
                f"SELECT {_AUDIT_COLUMNS} FROM erasure_audit a"
                " WHERE a.subject = %s AND a.scope = %s ORDER BY a.id DESC LIMIT 1",
                (subject, scope.value),
            ).fetchone()
        return None if row is None else _record(row)

    def of_target(self, subject: str, target: str) -> ErasureRecord | None:
        """The most recent erasure of the memory's fact with this keyed digest
        (`SubjectHasher.fact`), open or completed; None for a fact no erasure was asked of
        since migration 0023."""
        with self._transaction() as conn:
            row = conn.execute(
                f"SELECT {_AUDIT_COLUMNS} FROM erasure_audit a"
                " WHERE a.subject = %s AND a.target = %s ORDER BY a.id DESC LIMIT 1",
                (subject, target),
            ).fetchone()
        return None if row is None else _record(row)

    def receipts(self, subject: str) -> list[ErasureRecord]:
        """Every erasure of a memory, oldest first (found by its digest, never by its ids)."""
        with self._transaction() as conn:
            rows = conn.execute(
                f"SELECT {_AUDIT_COLUMNS} FROM erasure_audit a WHERE a.subject = %s ORDER BY a.id",
                (subject,),
            ).fetchall()
        return [_record(r) for r in rows]

    def open_erasures(self) -> OpenErasures:
        """How many erasures are started and not completed, and how long the oldest has been."""
        with self._transaction() as conn:
            row = conn.execute(
                "SELECT count(*), coalesce(extract(epoch FROM now() - min(a.requested_at)), 0)"
                " FROM erasure_audit a JOIN erasure_pending p USING (erasure_id)"
            ).fetchone()
        return OpenErasures(0, 0.0) if row is None else OpenErasures(int(row[0]), float(row[1]))

    def pending(self) -> list[PendingErasure]:
        with self._transaction() as conn:
            rows = conn.execute(
                f"SELECT {_AUDIT_COLUMNS}, p.organization_id, p.user_id, p.fact_id"
                " FROM erasure_audit a JOIN erasure_pending p USING (erasure_id)"
                " ORDER BY a.id"
            ).fetchall()
        return [PendingErasure(_record(r), MemoryKey(r[11], r[12]), r[13]) for r in rows]

    # -- the steps ------------------------------------------------------------------------

    def start(
        self,
        erasure_id: uuid.UUID,
        *,
        subject: str,
        scope: ErasureScope,
        key: MemoryKey,
        fact_id: uuid.UUID | None,
        actor: str,
        reason: str,
        target: str | None = None,
        join_open: bool = False,
    ) -> ErasureRecord:
        """Audit the erasure before it removes anything; idempotent on `erasure_id`.

        `target` is the keyed digest of the fact a fact erasure removes (`of_target`). With
        `join_open`, an erasure of the same memory (or fact) already open is returned instead
        of a new one audited."""
        if not actor.strip() or not reason.strip():
            raise ValueError("an erasure needs an actor and a reason")
        with self._transaction() as conn:
            if join_open:
                # Two requests that found none open may audit at once: one under the memory's
                # lock, one that gave up waiting for it (a flush holds it). Taken in turn, the
                # second finds the first's open erasure, committed, and shares it.
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (erasure_lock_key(key),))
                row = conn.execute(_OPEN_ERASURE, (subject, scope.value, fact_id)).fetchone()
                if row is not None:
                    return _record(row)
            inserted = conn.execute(
                "INSERT INTO erasure_audit"
                " (erasure_id, subject, scope, status, actor, reason, target)"
                " VALUES (%s, %s, %s, 'started', %s, %s, %s)"
                " ON CONFLICT (erasure_id) DO NOTHING RETURNING erasure_id",
                (erasure_id, subject, scope.value, actor, reason, target),
            ).fetchone()
            if inserted is not None:
                conn.execute(
                    "INSERT INTO erasure_pending (erasure_id, organization_id, user_id, fact_id)"
                    " VALUES (%s, %s, %s, %s)",
                    (erasure_id, key.organization_id, key.user_id, fact_id),
                )
        record = self.get(erasure_id)
        if record is None:
            raise StoreError(f"erasure {erasure_id} vanished after it was audited")
        return record

    def record_tombstone(
        self,
        erasure_id: uuid.UUID,
        subject: str,
        tombstone: TombstoneAt,
        cutoffs: Mapping[tuple[str, int], int],
    ) -> None:
        """The tombstone's place and every partition's cut-off, in one transaction.

        A later erasure of the same memory only ever moves a cut-off forward.
        """
        with self._transaction() as conn, conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO memory_cutoffs (subject, topic, partition, cutoff, erasure_id)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (subject, topic, partition) DO UPDATE"
                " SET cutoff = greatest(memory_cutoffs.cutoff, EXCLUDED.cutoff),"
                " erasure_id = CASE WHEN EXCLUDED.cutoff > memory_cutoffs.cutoff"
                " THEN EXCLUDED.erasure_id ELSE memory_cutoffs.erasure_id END",
                [(subject, t, p, offset, erasure_id) for (t, p), offset in cutoffs.items()],
            )
            cur.execute(
                "UPDATE erasure_audit SET status = 'tombstoned', tombstone_topic = %s,"
                " tombstone_partition = %s, tombstone_offset = %s"
                " WHERE erasure_id = %s AND status = 'started'",
                (tombstone.topic, tombstone.partition, tombstone.offset, erasure_id),
            )

    def erase_memory(
        self, erasure_id: uuid.UUID, key: MemoryKey, subject: str, extra: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Every row of the memory, in one transaction (the SQL function `erase_memory`).

        Events at or after the memory's cut-offs stay: they arrived after the tombstone and
        belong to the memory that starts afresh.
        """
        with self._transaction() as conn:
            row = conn.execute(
                "SELECT erase_memory(%s, %s, %s, %s, %s, %s, %s)",
                (
                    erasure_id,
                    key.organization_id,
                    key.user_id,
                    subject,
                    f"erased:{erasure_id}",
                    log_lock_key(key),
                    Jsonb(dict(extra)),
                ),
            ).fetchone()
        return dict(row[0]) if row else {}

    def erase_fact(
        self, erasure_id: uuid.UUID, key: MemoryKey, fact_id: uuid.UUID, extra: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The fact and every copy of its text, in one transaction (the SQL function
        `erase_fact`), under the memory's log lock: an insert of the memory's events in flight
        finishes first (and is redacted), a later one sees the redacted sources."""
        with self._transaction() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (log_lock_key(key),))
            row = conn.execute(
                "SELECT erase_fact(%s, %s, %s, %s, %s)",
                (erasure_id, key.organization_id, key.user_id, fact_id, Jsonb(dict(extra))),
            ).fetchone()
        return dict(row[0]) if row else {}

    def complete(self, erasure_id: uuid.UUID) -> ErasureRecord:
        """Seal the receipt and forget whose erasure it was, in one transaction."""
        record = self.get(erasure_id)
        if record is None:
            raise StoreError(f"no erasure {erasure_id}")
        if record.status is ErasureStatus.COMPLETED:
            return record
        if record.status is not ErasureStatus.POSTGRES_ERASED:
            raise StoreError(f"erasure {erasure_id} is {record.status}, not ready to complete")
        receipt = record.receipt()
        with self._transaction() as conn:
            conn.execute(
                "UPDATE erasure_audit SET status = 'completed', digest = %s, erased_at = now()"
                " WHERE erasure_id = %s AND status = 'postgres_erased'",
                (receipt.digest, erasure_id),
            )
            conn.execute("DELETE FROM erasure_pending WHERE erasure_id = %s", (erasure_id,))
        done = self.get(erasure_id)
        if done is None:
            raise StoreError(f"erasure {erasure_id} vanished while completing")
        return done

    def _transaction(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        return transaction(self._pool, "erasure log")
