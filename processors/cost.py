"""Prices and the ledger entries a run owes. Integer micro-dollars: sums stay exact.

A price is read as the decimal it was written as (0.3, not the binary float just above it),
so a cost that is a whole number of micro-dollars is not rounded up to the next one.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction

from domain.ids import ledger_entry_id_for
from domain.model import LedgerEntry, TokenUsage


@dataclass(frozen=True)
class ModelPrice:
    input_usd_per_mtok: float = 0.0
    output_usd_per_mtok: float = 0.0
    usd_per_1k_embeddings: float = 0.0


class PriceTable:
    def __init__(self, prices: Mapping[str, ModelPrice]) -> None:
        self._prices = dict(prices)

    def price(self, model: str) -> ModelPrice:
        # An unknown model costs nothing rather than failing the run; the SRE dashboard shows
        # spend per model, so a missing price is visible as a zero line.
        return self._prices.get(model, ModelPrice())

    def llm_cost_micro_usd(self, model: str, usage: TokenUsage) -> int:
        p = self.price(model)
        # (tokens / 1e6) * usd per Mtok * 1e6 micro-usd per usd
        prompt = usage.prompt_tokens * _exact(p.input_usd_per_mtok)
        completion = usage.completion_tokens * _exact(p.output_usd_per_mtok)
        return math.ceil(prompt + completion)

    def embedding_cost_micro_usd(self, model: str, texts: int) -> int:
        return math.ceil(texts * _exact(self.price(model).usd_per_1k_embeddings) * 1_000)


def _exact(price: float) -> Fraction:
    return Fraction(str(price))


def llm_entry(
    prices: PriceTable,
    *,
    run_id: uuid.UUID,
    user_id: str,
    organization_id: str,
    model: str,
    usage: TokenUsage,
    at: datetime,
) -> LedgerEntry:
    return LedgerEntry(
        entry_id=ledger_entry_id_for(run_id, "llm"),
        user_id=user_id,
        organization_id=organization_id,
        run_id=run_id,
        operation="llm",
        model=model,
        units=usage.total,
        cost_micro_usd=prices.llm_cost_micro_usd(model, usage),
        occurred_at=at,
    )


def embedding_entry(
    prices: PriceTable,
    *,
    run_id: uuid.UUID | None,
    batch_key: str,
    user_id: str,
    organization_id: str,
    model: str,
    texts: int,
    at: datetime,
) -> LedgerEntry:
    """`batch_key` names the batch (e.g. the sorted fact ids) so a retried batch is one entry."""
    entry_run = run_id or uuid.UUID(int=0)
    return LedgerEntry(
        entry_id=ledger_entry_id_for(entry_run, "embedding", batch_key),
        user_id=user_id,
        organization_id=organization_id,
        run_id=run_id,
        operation="embedding",
        model=model,
        units=texts,
        cost_micro_usd=prices.embedding_cost_micro_usd(model, texts),
        occurred_at=at,
    )
