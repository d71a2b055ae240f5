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

from psycopg_pool import ConnectionPool

from domain.model import LedgerEntry, TokenUsage
from store.postgres import transaction
from store.write.run_rows import insert_ledger


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
        with transaction(self._pool, f"booking {len(entries)} read cost(s)") as conn:
            insert_ledger(conn, entries)
