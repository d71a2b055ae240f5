"""What one read costs, handed to the ledger off the hot path.

A chat turn embeds its query (the dense search) and may call an LLM to rewrite it; both are
booked to the user's credit ledger like consolidation's costs. The price table lives with the
processors, so the read path only says what happened (`ReadCharge`) and the composition root
turns that into ledger entries; entry ids derive from the read's audit row id, so a retried
turn is booked once (`ON CONFLICT DO NOTHING`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg_pool import ConnectionPool

from domain.model import LedgerEntry, TokenUsage
from store.errors import DatabaseUnavailable, StoreError
from store.postgres import transaction


@dataclass(frozen=True)
class ReadCharge:
    log_id: uuid.UUID
    user_id: str
    organization_id: str
    at: datetime
    embedded_query: bool  # the dense search embedded the query
    rewrite_usage: TokenUsage | None  # tokens of the query rewrite call, if one answered


class ReadLedger:
    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool

    def write(self, entries: Sequence[LedgerEntry]) -> None:
        try:
            with transaction(self._pool) as conn, conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO credit_ledger (entry_id, user_id, organization_id, run_id,"
                    " operation, model, units, cost_micro_usd, occurred_at)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
                    " ON CONFLICT (entry_id) DO NOTHING",
                    [
                        (
                            e.entry_id,
                            e.user_id,
                            e.organization_id,
                            e.run_id,
                            e.operation,
                            e.model,
                            e.units,
                            e.cost_micro_usd,
                            e.occurred_at,
                        )
                        for e in entries
                    ],
                )
        except DatabaseUnavailable:
            raise
        except psycopg.Error as e:
            raise StoreError(f"booking {len(entries)} read cost(s) failed: {e}") from e
