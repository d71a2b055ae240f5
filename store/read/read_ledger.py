"""What one read costs, handed to the ledger off the hot path.

A chat turn embeds its query (the dense search) and may call an LLM to rewrite it; both are
booked to the user's credit ledger like consolidation's costs. The price table lives with the
processors, so the read path only says what happened (`ReadCharge`) and the composition root
turns that into ledger entries; entry ids derive from the read's audit row id, so a retried
turn's query embedding is booked once (`ON CONFLICT DO NOTHING`); a rewrite's also from its
call, as each call is billed.

A cost is written in the background, so it can arrive once an erasure of its memory has
opened (or completed): it is then booked under the erasure's pseudonym, as the erasure
anonymises the memory's earlier rows, never with the ids the user asked to have forgotten.
An erasure of one fact forgets no user: a cost that arrives after one (which gave the memory
a new generation) is the user's still.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from psycopg_pool import ConnectionPool

from domain.ids import MemoryKey, SubjectHasher
from domain.model import LedgerEntry, TokenUsage
from store.postgres import transaction
from store.read.fact_queries import hold_off_erasures, still_the_memory_read


@dataclass(frozen=True)
class ReadCharge:
    log_id: uuid.UUID
    user_id: str
    organization_id: str
    at: datetime
    embedded_query: bool  # the dense search embedded the query
    rewrite_usage: TokenUsage | None  # tokens of the query rewrite call, if one answered
    # The turn's rewrite call: a retried turn (same log id) that calls the model again is
    # billed again, so each call is its own entry.
    rewrite_call: uuid.UUID


@dataclass(frozen=True)
class ReadCost:
    """A ledger entry of a read, with the memory generation the read saw and when it read."""

    entry: LedgerEntry
    generation: uuid.UUID | None
    read_at: datetime


# The erasure open on the memory, if any: its pseudonym is the one `erase_memory` gives the
# memory's ledger rows. One that completed before the cost arrived is no longer known here:
# the cost goes under a pseudonym naming no erasure. Off the memory's ids, the entry id is
# derived anew (the erasure re-keys the rows it anonymises for the same reason).
# A memory the turn read that has another generation now went through a fact erasure, or
# was forgotten and came back (its user returned): the cost keeps the user's ids only if no
# erasure of the memory is open and none completed since the turn read (the turn's clock is
# the read path's, the audit's Postgres's, as in `still_the_memory_read`).
_OURS = still_the_memory_read("e.generation", "e.org", "e.user_id", "e.subject", "e.read_at")
_BOOK = (
    "WITH e AS (SELECT %(entry_id)s::uuid AS entry_id, %(org)s::text AS org,"
    " %(user_id)s::text AS user_id, %(generation)s::uuid AS generation,"
    " %(subject)s::text AS subject, %(read_at)s::timestamptz AS read_at),"
    f" s AS (SELECT e.*, {_OURS} AS ours,"
    " (SELECT p.erasure_id::text FROM erasure_pending p WHERE p.organization_id = e.org"
    " AND p.user_id = e.user_id AND p.fact_id IS NULL ORDER BY p.erasure_id LIMIT 1) AS erasure,"
    " EXISTS (SELECT 1 FROM user_memory m WHERE m.organization_id = e.org"
    " AND m.user_id = e.user_id) AS kept,"
    " EXISTS (SELECT 1 FROM erasure_audit a WHERE a.subject = e.subject"
    " AND a.scope = 'memory' AND a.erased_at >= e.read_at) AS forgotten"
    " FROM e),"
    " n AS (SELECT s.*, ours OR (erasure IS NULL AND kept AND NOT forgotten) AS named FROM s)"
    " INSERT INTO credit_ledger (entry_id, user_id, organization_id, run_id, operation, model,"
    " units, cost_micro_usd, occurred_at)"
    " SELECT CASE WHEN named THEN entry_id"
    " ELSE md5(entry_id::text || ':' || coalesce(erasure, 'unknown'))::uuid END,"
    " CASE WHEN named THEN user_id ELSE 'erased:' || coalesce(erasure, 'unknown') END,"
    " org, NULL, %(operation)s, %(model)s, %(units)s, %(cost)s, %(at)s FROM n"
    " ON CONFLICT (entry_id) DO NOTHING"
)


class ReadLedger:
    def __init__(self, pool: ConnectionPool, subjects: SubjectHasher) -> None:
        self._pool = pool
        self._subjects = subjects  # the erasure audit names a memory by this digest

    def write(self, costs: Sequence[ReadCost]) -> None:
        with (
            transaction(self._pool, f"booking {len(costs)} read cost(s)") as conn,
            conn.cursor() as cur,
        ):
            hold_off_erasures(
                cur, [MemoryKey(c.entry.organization_id, c.entry.user_id) for c in costs]
            )
            cur.executemany(_BOOK, [self._params(c) for c in costs])

    def _params(self, cost: ReadCost) -> dict[str, object]:
        e = cost.entry
        return {
            "entry_id": e.entry_id,
            "org": e.organization_id,
            "user_id": e.user_id,
            "generation": cost.generation,
            "subject": self._subjects(MemoryKey(e.organization_id, e.user_id)),
            "read_at": cost.read_at,
            "operation": e.operation,
            "model": e.model,
            "units": e.units,
            "cost": e.cost_micro_usd,
            "at": e.occurred_at,
        }
