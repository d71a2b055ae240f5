"""What the maintenance jobs read and write beyond one user's memory: which memories to
visit, the retention of read audit rows, and the cluster-level record of every job run."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from domain.ids import MemoryKey
from store.postgres import transaction

# Longer than a flush can take from its start to its commit (model calls, bisecting probes).
DUPLICATE_LOOKBACK = timedelta(hours=1)


# The tables of what `replay verify` checks of a memory, by (organization_id, user_id): its
# events, its runs and the state they fold to. Not its credit line nor its read audit rows:
# the fold neither makes nor reads them, so a memory with only those would pass having been
# checked for nothing.
REPLAYED_TABLES = (
    "user_memory",
    "consolidation_runs",
    "memory_facts",
    "context_events",
    "consolidated_events",
    "connections",
)

# The columns of a MaintenanceRunRow, in its order.
_RUNS = (
    "SELECT run_id, job, started_at, outcome, users, changes, parameters, error, skipped"
    " FROM maintenance_runs"
)


@dataclass(frozen=True)
class MaintenanceRunRow:
    run_id: uuid.UUID
    job: str
    started_at: datetime
    outcome: str
    users: int
    changes: Mapping[str, int]
    parameters: Mapping[str, Any]
    error: str | None = None
    skipped: int = 0  # memories the run left for a later one


class MaintenanceQueries:
    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool

    def lifecycle_candidates(
        self, *, active_before: datetime, stale_before: datetime
    ) -> list[MemoryKey]:
        """Memories with a fact some lifecycle rule may apply to (the rules decide exactly).

        Open loops are always candidates: their due date is in their text.
        """
        with transaction(self._pool) as conn:
            rows = conn.execute(
                "SELECT DISTINCT organization_id, user_id FROM memory_facts WHERE NOT pinned AND ("
                " (status = 'active' AND (fact_type = 'open_loop'"
                "   OR greatest(created_at, coalesce(last_reinforced_at, created_at)) <= %s))"
                " OR (status = 'stale' AND updated_at <= %s))"
                " ORDER BY organization_id, user_id",
                (active_before, stale_before),
            ).fetchall()
        return [MemoryKey(*r) for r in rows]

    def memories(self, organization_id: str | None = None) -> list[MemoryKey]:
        """Every memory with anything `replay verify` checks, in one organization or all of them:
        a memory with facts or events but no state or run is one it must see."""
        union = " UNION ".join(
            f"SELECT organization_id, user_id FROM {table}"
            " WHERE %(org)s::text IS NULL OR organization_id = %(org)s"
            for table in REPLAYED_TABLES
        )
        with transaction(self._pool) as conn:
            rows = conn.execute(f"{union} ORDER BY 1, 2", {"org": organization_id}).fetchall()
        return [MemoryKey(*r) for r in rows]

    def holds(self, key: MemoryKey) -> bool:
        """Whether the memory has anything `replay verify` checks (what `memories` would list)."""
        exists = " UNION ALL ".join(
            f"SELECT 1 FROM {table} WHERE organization_id = %(org)s AND user_id = %(user)s"
            for table in REPLAYED_TABLES
        )
        params = {"org": key.organization_id, "user": key.user_id}
        with transaction(self._pool) as conn:
            row = conn.execute(f"SELECT EXISTS ({exists})", params).fetchone()
        return bool(row and row[0])

    def duplicate_candidates(self, changed_since: datetime | None) -> list[MemoryKey]:
        """Memories with two active facts or more, one of them changed since `changed_since`
        less `DUPLICATE_LOOKBACK`: a flush stamps its facts when it starts, before its model
        call, and commits later, so facts committed while the last sweep ran can carry a time
        before its start."""
        since = None if changed_since is None else changed_since - DUPLICATE_LOOKBACK
        with transaction(self._pool) as conn:
            rows = conn.execute(
                "SELECT organization_id, user_id FROM memory_facts WHERE status = 'active'"
                " GROUP BY organization_id, user_id HAVING count(*) > 1"
                " AND (%(since)s::timestamptz IS NULL OR max(updated_at) >= %(since)s)"
                " ORDER BY organization_id, user_id",
                {"since": since},
            ).fetchall()
        return [MemoryKey(*r) for r in rows]

    def erasure_open(self, key: MemoryKey) -> bool:
        """Whether an erasure of the memory, or of one of its facts, is under way."""
        with transaction(self._pool) as conn:
            row = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM erasure_pending"
                " WHERE organization_id = %s AND user_id = %s)",
                (key.organization_id, key.user_id),
            ).fetchone()
        return bool(row and row[0])

    def delete_context_logs(self, before: datetime, batch: int = 10_000) -> Iterator[int]:
        """Delete read audit rows older than `before`, a batch per transaction; yields how
        many each committed batch deleted, so a run that fails midway can count those."""
        while True:
            with transaction(self._pool) as conn:
                deleted = conn.execute(
                    "DELETE FROM context_logs WHERE log_id IN (SELECT log_id FROM context_logs"
                    " WHERE created_at < %s LIMIT %s)",
                    (before, batch),
                ).rowcount
            yield deleted
            if deleted < batch:
                return

    def record_run(self, row: MaintenanceRunRow) -> None:
        with transaction(self._pool) as conn:
            conn.execute(
                "INSERT INTO maintenance_runs (run_id, job, started_at, outcome, users, changes,"
                " parameters, error, skipped) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (run_id) DO NOTHING",
                (
                    row.run_id,
                    row.job,
                    row.started_at,
                    row.outcome,
                    row.users,
                    Jsonb(dict(row.changes)),
                    Jsonb(dict(row.parameters)),
                    row.error,
                    row.skipped,
                ),
            )

    def last_complete(self, job: str) -> datetime | None:
        """When the last run of `job` that succeeded and left no memory for later started."""
        with transaction(self._pool) as conn:
            row = conn.execute(
                "SELECT max(started_at) FROM maintenance_runs"
                " WHERE job = %s AND outcome = 'succeeded' AND skipped = 0",
                (job,),
            ).fetchone()
        return None if row is None else row[0]

    def last_skipped(self, jobs: Sequence[str]) -> dict[str, int]:
        """Per job of `jobs` that has run, how many memories its last run left for the next."""
        with transaction(self._pool) as conn:
            rows = conn.execute(
                "SELECT j.job, r.skipped FROM unnest(%s::text[]) AS j(job)"
                " CROSS JOIN LATERAL (SELECT skipped FROM maintenance_runs m"
                " WHERE m.job = j.job ORDER BY seq DESC LIMIT 1) r",
                (list(jobs),),
            ).fetchall()
        return dict(rows)

    def last_run(self, job: str) -> MaintenanceRunRow | None:
        with transaction(self._pool) as conn:
            row = conn.execute(
                f"{_RUNS} WHERE job = %s ORDER BY seq DESC LIMIT 1",
                (job,),
            ).fetchone()
        return None if row is None else MaintenanceRunRow(*row)

    def runs(self, job: str | None = None) -> list[MaintenanceRunRow]:
        with transaction(self._pool) as conn:
            rows = conn.execute(
                f"{_RUNS} WHERE %(job)s::text IS NULL OR job = %(job)s ORDER BY seq",
                {"job": job},
            ).fetchall()
        return [MaintenanceRunRow(*r) for r in rows]
