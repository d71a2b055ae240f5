"""Prices and the ledger entries a run owes. Integer micro-dollars: sums stay exact.

A price is read as the decimal it was written as (0.3, not the binary float just above it),
so a cost that is a whole number of micro-dollars is not rounded up to the next one.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from fractions import Fraction

from domain.ids import MemoryKey, ledger_entry_id_for, read_entry_id_for
from domain.model import LedgerEntry, TokenUsage
from processors.errors import ProcessorError


class UnknownModelPrice(ProcessorError):
    """A model in use has no price and no default price is configured."""


@dataclass(frozen=True)
class ModelPrice:
    input_usd_per_mtok: float = 0.0
    output_usd_per_mtok: float = 0.0
    usd_per_1k_embeddings: float = 0.0
    # Prompt tokens the provider's context cache served; unset: the input price.
    cached_input_usd_per_mtok: float | None = None


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

    def require(self, models: Iterable[str]) -> list[str]:
        """Refuses models without a price unless there is a default; returns those the default
        will price."""
        missing = sorted({m for m in models if m not in self._prices})
        if missing and self._default is None:
            raise UnknownModelPrice(
                f"no price for {', '.join(missing)}: add it to the prices setting"
                " (MEMORYD_PRICES) or configure default_price"
            )
        return missing

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
        cached = min(usage.cached_prompt_tokens, usage.prompt_tokens)
        cached_price = p.input_usd_per_mtok
        if p.cached_input_usd_per_mtok is not None:
            cached_price = p.cached_input_usd_per_mtok
        prompt = (usage.prompt_tokens - cached) * _exact(p.input_usd_per_mtok)
        prompt += cached * _exact(cached_price)
        completion = usage.completion_tokens * _exact(p.output_usd_per_mtok)
        return math.ceil(prompt + completion)

    def embedding_cost_micro_usd(self, model: str, texts: int) -> int:
        return math.ceil(texts * _exact(self.price(model).usd_per_1k_embeddings) * 1_000)


def _exact(price: float) -> Fraction:
    return Fraction(str(price))


@dataclass(frozen=True)
class _Charge:
    """What one operation costs, before it is booked to a memory."""

    operation: str
    model: str
    units: int
    cost_micro_usd: int

    def booked(
        self, entry_id: uuid.UUID, run_id: uuid.UUID | None, key: MemoryKey, at: datetime
    ) -> LedgerEntry:
        return LedgerEntry(
            entry_id=entry_id,
            user_id=key.user_id,
            organization_id=key.organization_id,
            run_id=run_id,
            occurred_at=at,
            **asdict(self),
        )


def _llm_call(prices: PriceTable, model: str, usage: TokenUsage) -> _Charge:
    return _Charge("llm", model, usage.total, prices.llm_cost_micro_usd(model, usage))


def _embedding(prices: PriceTable, model: str, texts: int) -> _Charge:
    return _Charge("embedding", model, texts, prices.embedding_cost_micro_usd(model, texts))


def llm_entry(
    prices: PriceTable,
    *,
    run_id: uuid.UUID,
    key: MemoryKey,
    model: str,
    usage: TokenUsage,
    at: datetime,
) -> LedgerEntry:
    entry_id = ledger_entry_id_for(run_id, "llm")
    return _llm_call(prices, model, usage).booked(entry_id, run_id, key, at)


def embedding_entry(
    prices: PriceTable,
    *,
    run_id: uuid.UUID | None,
    batch_key: str,
    key: MemoryKey,
    model: str,
    texts: int,
    at: datetime,
) -> LedgerEntry:
    """`batch_key` names the batch (e.g. the sorted fact ids) so a retried batch is one entry."""
    entry_id = ledger_entry_id_for(run_id or uuid.UUID(int=0), "embedding", batch_key)
    return _embedding(prices, model, texts).booked(entry_id, run_id, key, at)


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
    rewrite_call: uuid.UUID,
) -> list[LedgerEntry]:
    """What one read (one chat turn) costs: its query embedding and its query rewrite.

    Keyed by the read's audit row id, so a retried turn (same turn id) books its embedding
    once. The rewrite is keyed by its call as well: a retried turn that asks the model again
    pays for a second call, and books it.
    """
    charges: list[tuple[str, _Charge]] = []
    if embedding_model is not None:
        charges.append(("query-embedding", _embedding(prices, embedding_model, 1)))
    if rewrite_model is not None and rewrite_usage is not None:
        rewrite = _llm_call(prices, rewrite_model, rewrite_usage)
        charges.append((f"query-rewrite\x1f{rewrite_call}", rewrite))
    key = MemoryKey(organization_id, user_id)
    return [
        charge.booked(read_entry_id_for(log_id, what), None, key, at) for what, charge in charges
    ]
