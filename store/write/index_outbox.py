"""The index outbox's reads: the facts whose current version the vector index has not got,
and how large and how old that backlog is; each leaves out the facts of users out of credit
when asked."""

from __future__ import annotations

from datetime import datetime

from psycopg_pool import ConnectionPool

from domain.model import Fact
from domain.ports import PendingBacklog
from store import fact_rows
from store.postgres import transaction

# Memories with a credit line that is spent: the index drain leaves their facts (rows `f`)
# pending when the budget policy says so (see consumers.flush.BudgetPolicy.SKIP_EMBEDDINGS).
_OUT_OF_CREDIT = (
    "EXISTS (SELECT 1 FROM user_credits c WHERE c.organization_id = f.organization_id"
    " AND c.user_id = f.user_id"
    " AND c.credit_micro_usd <= coalesce((SELECT sum(l.cost_micro_usd) FROM credit_ledger l"
    " WHERE l.organization_id = c.organization_id AND l.user_id = c.user_id), 0))"
)


def _pending(skip_out_of_credit: bool) -> str:
    hold = f" AND NOT {_OUT_OF_CREDIT}" if skip_out_of_credit else ""
    return f"indexed_at IS NULL{hold}"


def pending_query(skip_out_of_credit: bool) -> str:
    """The oldest pending facts, `%s` of them: what each pass of the index drain reads."""
    return (
        f"SELECT {fact_rows.COLUMNS} FROM {fact_rows.READ_FROM} f"
        f" WHERE {_pending(skip_out_of_credit)} ORDER BY updated_at, fact_id LIMIT %s"
    )


def backlog_query(skip_out_of_credit: bool) -> str:
    """How many facts are pending, and when the oldest of them changed."""
    where = _pending(skip_out_of_credit)
    return f"SELECT count(*), min(updated_at) FROM memory_facts f WHERE {where}"


def pending_index(pool: ConnectionPool, limit: int, skip_out_of_credit: bool) -> list[Fact]:
    with transaction(pool) as conn:
        rows = conn.execute(pending_query(skip_out_of_credit), (limit,)).fetchall()
    return [fact_rows.from_row(r) for r in rows]


def pending_backlog(pool: ConnectionPool, skip_out_of_credit: bool) -> PendingBacklog:
    with transaction(pool) as conn:
        row = conn.execute(backlog_query(skip_out_of_credit)).fetchone()
    if row is None:  # an aggregate without GROUP BY returns one row; kept for the type
        return PendingBacklog(count=0, oldest=None)
    oldest: datetime | None = row[1]
    return PendingBacklog(count=int(row[0]), oldest=oldest)
