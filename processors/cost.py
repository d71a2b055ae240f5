"""Prices and the ledger entries a run owes. Integer micro-dollars: sums stay exact.

A price is read as the decimal it was written as (0.3, not the binary float just above it),
so a cost that is a whole number of micro-dollars is not rounded up to the next one.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction

from domain.ids import ledger_entry_id_for, read_entry_id_for
from domain.model import LedgerEntry, TokenUsage
from processors.errors import ProcessorError


class UnknownModelPrice(ProcessorError):
    """A model in use has no price and no default price is configured."""


@dataclass(frozen=True)
class ModelPrice:
    input_usd_per_mtok: float = 0.0
    output_usd_per_mtok: float = 0.0
    usd_per_1k_embeddings: float = 0.0


class PriceTable:
    """Prices by model. `require` refuses, at start-up, a model in use without a price unless
    a default price is configured; a model that turns up later unpriced (a backend answering
    with another model name) gets the default and is reported through `on_unpriced`, never
    silently priced at zero."""

    def __init__(
        self,
        prices: Mapping[str, ModelPrice],
        default: ModelPrice | None = None,
        on_unpriced: Callable[[str], None] | None = None,
    ) -> None:
        self._prices = dict(prices)
        self._default = default
        self._on_unpriced = on_unpriced

    def require(self, models: Iterable[str]) -> None:
        missing = sorted({m for m in models if m not in self._prices})
        if missing and self._default is None:
            raise UnknownModelPrice(
                f"no price for {', '.join(missing)}: add it to the prices setting"
                " (MEMORYD_PRICES) or configure default_price"
            )

    def price(self, model: str) -> ModelPrice:
        known = self._prices.get(model)
        if known is not None:
            return known
        if self._on_unpriced is not None:
            self._on_unpriced(model)
        return self._default or ModelPrice()

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


def read_entries(
    prices: PriceTable,
    *,
    log_id: uuid.UUID,
    user_id: str,
    organization_id: str,
    at: datetime,
    embedding_model: str | None,
    rewrite_model: str | None,
    rewrite_usage: TokenUsage | None,
) -> list[LedgerEntry]:
    """What one read (one chat turn) costs: its query embedding and its query rewrite.

    Keyed by the read's audit row id, so a retried turn (same turn id) is booked once.
    """
    entries = []
    if embedding_model is not None:
        entries.append(
            LedgerEntry(
                entry_id=read_entry_id_for(log_id, "query-embedding"),
                user_id=user_id,
                organization_id=organization_id,
                run_id=None,
                operation="embedding",
                model=embedding_model,
                units=1,
                cost_micro_usd=prices.embedding_cost_micro_usd(embedding_model, 1),
                occurred_at=at,
            )
        )
    if rewrite_model is not None and rewrite_usage is not None:
        entries.append(
            LedgerEntry(
                entry_id=read_entry_id_for(log_id, "query-rewrite"),
                user_id=user_id,
                organization_id=organization_id,
                run_id=None,
                operation="llm",
                model=rewrite_model,
                units=rewrite_usage.total,
                cost_micro_usd=prices.llm_cost_micro_usd(rewrite_model, rewrite_usage),
                occurred_at=at,
            )
        )
    return entries
