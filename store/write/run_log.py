"""Read-only queries over the derived logs, for replay, history and export.

The processor writes `consolidation_runs`, `fact_history` and `credit_ledger`; nothing here
writes anything. Analyst tools connect with `read_only_dsn`, so Postgres itself refuses a
write that a bug might attempt.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from itertools import groupby
from typing import Any

from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool

from domain.ids import MemoryKey
from domain.model import (
    ConnectionContext,
    Fact,
    GateCounts,
    LedgerEntry,
    LoggedRun,
    RunRecord,
    RunStatus,
    TokenUsage,
)
from store import fact_rows
from store.postgres import streamed, transaction

_READ_ONLY = "-c default_transaction_read_only=on"
_MEMORY = "organization_id = %s AND user_id = %s"


def _params(key: MemoryKey) -> tuple[str, str]:
    return (key.organization_id, key.user_id)


_GATE_FIELDS = frozenset(f.name for f in fields(GateCounts))
# Runs a page of `iter_runs` reads: a run's output and raw response are some kilobytes each,
# and a memory can have thousands of runs.
RUN_PAGE = 200


def _run_columns(*, output: bool, raw_response: bool) -> str:
    """The columns `_run_from_row` reads; the two big ones read as NULL unless wanted."""
    return (
        "seq, finished_at, run_id, user_id, organization_id, input_event_ids, backend, model,"
        " prompt_version, status, attempt, base_version,"
        f" {'output' if output else 'NULL'}, {'raw_response' if raw_response else 'NULL'}, gate,"
        " prompt_tokens, completion_tokens, cost_micro_usd, duration_ms, started_at, error"
    )


_HISTORY_COLUMNS = "h.id, h.fact_id, h.run_id, h.operation, h.before, h.after, h.changed_at"


def _ledger_query(key: MemoryKey) -> tuple[str, tuple[str, str]]:
    query = (
        "SELECT seq, entry_id, user_id, organization_id, run_id, operation, model, units,"
        f" cost_micro_usd, occurred_at FROM credit_ledger WHERE {_MEMORY} ORDER BY seq"
    )
    return query, _params(key)


def read_only_dsn(dsn: str) -> str:
    """The same database, but every transaction on it is READ ONLY."""
    params = conninfo_to_dict(dsn)
    options = str(params.get("options") or "")
    params["options"] = f"{options} {_READ_ONLY}".strip()
    return make_conninfo("", **params)


@dataclass(frozen=True)
class FactHistoryEntry:
    id: int
    fact_id: uuid.UUID
    run_id: uuid.UUID
    operation: str
    before: dict[str, Any] | None
    after: dict[str, Any]
    changed_at: datetime


@dataclass(frozen=True)
class LedgerRow:
    seq: int
    entry: LedgerEntry


def _run_from_row(row: Sequence[Any]) -> LoggedRun:
    (
        seq,
        finished_at,
        run_id,
        user_id,
        org,
        input_event_ids,
        backend,
        model,
        prompt_version,
        status,
        attempt,
        base_version,
        output,
        raw_response,
        gate,
        prompt_tokens,
        completion_tokens,
        cost,
        duration_ms,
        started_at,
        error,
    ) = row
    run = RunRecord(
        run_id=run_id,
        user_id=user_id,
        organization_id=org,
        input_event_ids=tuple(input_event_ids),
        backend=backend,
        model=model,
        prompt_version=prompt_version,
        status=RunStatus(status),
        started_at=started_at,
        duration_ms=duration_ms,
        base_version=base_version,
        output=output,
        raw_response=raw_response,
        gate=GateCounts(**{k: int(v) for k, v in gate.items() if k in _GATE_FIELDS}),
        usage=TokenUsage(prompt_tokens, completion_tokens),
        cost_micro_usd=cost,
        error=error,
        attempt=attempt,
    )
    return LoggedRun(seq=seq, finished_at=finished_at, run=run)


class PostgresRunLog:
    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool

    def runs(self, key: MemoryKey) -> list[LoggedRun]:
        """Every run of the memory (all statuses), in log order, with everything it recorded."""
        return list(self.iter_runs(key, raw_response=True))

    def iter_runs(
        self,
        key: MemoryKey,
        *,
        output: bool = True,
        raw_response: bool = False,
        page: int = RUN_PAGE,
    ) -> Iterator[LoggedRun]:
        """Every run of the memory, in log order, read `page` runs at a time. Without
        `output` (what a fold needs) or `raw_response` (the model's own text, only an export
        shows it) those are not read: the runs carry None. Pages are separate statements:
        inside a `store.postgres.snapshot` they see one moment."""
        columns = _run_columns(output=output, raw_response=raw_response)
        last = 0
        while True:
            rows = self._fetch(
                f"SELECT {columns} FROM consolidation_runs WHERE {_MEMORY} AND seq > %s"
                " ORDER BY seq LIMIT %s",
                (*_params(key), last, page),
            )
            yield from map(_run_from_row, rows)
            if len(rows) < page:
                return
            last = rows[-1][0]

    def runs_with_ids(self, key: MemoryKey, run_ids: Collection[uuid.UUID]) -> list[LoggedRun]:
        """These runs of the memory, in log order, without their raw responses."""
        rows = self._fetch(
            f"SELECT {_run_columns(output=True, raw_response=False)} FROM consolidation_runs"
            f" WHERE {_MEMORY} AND run_id = ANY(%s) ORDER BY seq",
            (*_params(key), list(run_ids)),
        )
        return [_run_from_row(r) for r in rows]

    def fact_history(
        self, key: MemoryKey, fact_id: uuid.UUID | None = None
    ) -> list[FactHistoryEntry]:
        """The changes of the memory's facts, or of one of them, in the order they were made."""
        # fact_history has no memory columns; its facts do.
        rows = self._fetch(
            f"SELECT {_HISTORY_COLUMNS} FROM fact_history h JOIN memory_facts f USING (fact_id)"
            " WHERE f.organization_id = %s AND f.user_id = %s"
            " AND (%s::uuid IS NULL OR h.fact_id = %s) ORDER BY h.id",
            (*_params(key), fact_id, fact_id),
        )
        return [FactHistoryEntry(*r) for r in rows]

    def facts_with_history(self, key: MemoryKey) -> Iterator[tuple[Fact, list[FactHistoryEntry]]]:
        """Every fact of the memory in the memory store's order (created_at, fact id), each
        with its changes in the order they were made, read as they are used."""
        rows = streamed(
            self._pool,
            f"SELECT f.*, {_HISTORY_COLUMNS} FROM"
            f" (SELECT {fact_rows.COLUMNS} FROM {fact_rows.READ_FROM} WHERE {_MEMORY}) f"
            " LEFT JOIN fact_history h USING (fact_id) ORDER BY f.created_at, f.fact_id, h.id",
            _params(key),
            "fact history read",
        )
        # One row per change (a fact without any: one row, its change columns null).
        width = len(_HISTORY_COLUMNS.split(","))
        for _, group in groupby(rows, key=lambda r: r[0]):
            changes = list(group)
            yield (
                fact_rows.from_row(changes[0][:-width]),
                [FactHistoryEntry(*r[-width:]) for r in changes if r[-width] is not None],
            )

    def iter_ledger(self, key: MemoryKey) -> Iterator[LedgerRow]:
        """The memory's ledger in booking order, read as it is used."""
        rows = streamed(self._pool, *_ledger_query(key), "ledger read")
        return (LedgerRow(r[0], LedgerEntry(*r[1:])) for r in rows)

    def superseded(self, key: MemoryKey, by: uuid.UUID) -> list[uuid.UUID]:
        """The memory's facts that fact `by` superseded."""
        rows = self._fetch(
            f"SELECT fact_id FROM memory_facts WHERE {_MEMORY} AND superseded_by = %s"
            " ORDER BY fact_id",
            (*_params(key), by),
        )
        return [r[0] for r in rows]

    def ledger(self, key: MemoryKey) -> list[LedgerRow]:
        rows = self._fetch(*_ledger_query(key))
        return [LedgerRow(r[0], LedgerEntry(*r[1:])) for r in rows]

    def connections(self, key: MemoryKey) -> list[ConnectionContext]:
        rows = self._fetch(
            "SELECT connection_id, persistent_learned_info FROM connections"
            f" WHERE {_MEMORY} ORDER BY connection_id",
            _params(key),
        )
        return [ConnectionContext(r[0], tuple(r[1])) for r in rows]

    def indexed_at(self, key: MemoryKey) -> dict[uuid.UUID, datetime | None]:
        rows = self._fetch(
            f"SELECT fact_id, indexed_at FROM memory_facts WHERE {_MEMORY}", _params(key)
        )
        return {r[0]: r[1] for r in rows}

    def _fetch(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        with transaction(self._pool, "run log query") as conn:
            return conn.execute(sql, params).fetchall()
