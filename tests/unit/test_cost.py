"""Prices to integer micro-dollars: exact for prices written as decimals, rounded up once."""

from __future__ import annotations

import pytest

from domain.model import TokenUsage
from processors.cost import ModelPrice, PriceTable

TABLE = PriceTable(
    {
        "flash": ModelPrice(input_usd_per_mtok=0.30, output_usd_per_mtok=2.50),
        "odd": ModelPrice(input_usd_per_mtok=1.1, output_usd_per_mtok=0.7),
        "embed": ModelPrice(usd_per_1k_embeddings=0.1),
    }
)


@pytest.mark.parametrize(
    ("model", "prompt", "completion", "micro_usd"),
    [
        ("flash", 0, 0, 0),
        ("flash", 10, 0, 3),  # 10 x 0.3 is 3.0000000000000004 in floats, 3 in decimals
        ("flash", 1, 0, 1),  # 0.3 micro-dollars still costs one
        ("flash", 1_234, 321, 1_173),
        ("odd", 100, 0, 110),  # 100 x 1.1 is 110.00000000000001 in floats
        ("odd", 10, 10, 18),
        ("unknown-model", 1_000, 1_000, 0),
    ],
)
def test_llm_cost(model: str, prompt: int, completion: int, micro_usd: int) -> None:
    assert TABLE.llm_cost_micro_usd(model, TokenUsage(prompt, completion)) == micro_usd


@pytest.mark.parametrize(("texts", "micro_usd"), [(0, 0), (1, 100), (3, 300), (7, 700)])
def test_embedding_cost(texts: int, micro_usd: int) -> None:
    # 3 x 0.1 x 1000 is 300.00000000000006 in floats
    assert TABLE.embedding_cost_micro_usd("embed", texts) == micro_usd


def test_a_model_without_a_price_is_refused_at_start_up() -> None:
    from processors.cost import UnknownModelPrice  # noqa: PLC0415

    TABLE.require(["flash", "embed"])
    with pytest.raises(UnknownModelPrice, match="gemini-9-ultra"):
        TABLE.require(["flash", "gemini-9-ultra"])


def test_a_configured_default_prices_unknown_models_and_reports_each_use() -> None:
    seen: list[str] = []
    table = PriceTable(
        {"flash": ModelPrice(input_usd_per_mtok=0.30)},
        default=ModelPrice(input_usd_per_mtok=1.0, output_usd_per_mtok=1.0),
        on_unpriced=seen.append,
    )
    table.require(["flash", "gemini-9-ultra"])  # allowed: the default prices it
    assert table.llm_cost_micro_usd("gemini-9-ultra", TokenUsage(10, 10)) == 20
    assert table.llm_cost_micro_usd("flash", TokenUsage(10, 0)) == 3
    assert seen == ["gemini-9-ultra"]


def test_a_read_is_booked_once_per_turn_and_rewrite_call_with_deterministic_ids() -> None:
    import uuid  # noqa: PLC0415
    from datetime import UTC, datetime  # noqa: PLC0415

    from processors.cost import read_entries  # noqa: PLC0415

    def entries(log_id: uuid.UUID, call: int = 7) -> list[tuple[uuid.UUID, str, str, int, int]]:
        booked = read_entries(
            TABLE,
            log_id=log_id,
            user_id="ada",
            organization_id="org-a",
            at=datetime(2026, 11, 1, tzinfo=UTC),
            embedding_model="embed",
            rewrite_model="flash",
            rewrite_usage=TokenUsage(100, 10),
            rewrite_call=uuid.UUID(int=call),
        )
        return [(e.entry_id, e.operation, e.model, e.units, e.cost_micro_usd) for e in booked]

    first = entries(uuid.UUID(int=1))
    assert [(op, model, units, cost) for _, op, model, units, cost in first] == [
        ("embedding", "embed", 1, 100),
        ("llm", "flash", 110, 55),
    ]
    assert entries(uuid.UUID(int=1)) == first  # the same turn, the same entries
    assert {e[0] for e in entries(uuid.UUID(int=2))}.isdisjoint({e[0] for e in first})
    # The same turn retried calls the rewriter again: the same embedding, a second call.
    again = entries(uuid.UUID(int=1), call=8)
    assert again[0] == first[0]
    assert again[1][0] != first[1][0]


def test_prompt_tokens_the_context_cache_served_are_priced_at_the_cached_rate() -> None:
    cached = PriceTable(
        {"m": ModelPrice(input_usd_per_mtok=0.30, output_usd_per_mtok=2.50,
                         cached_input_usd_per_mtok=0.03)}
    )  # fmt: skip
    usage = TokenUsage(prompt_tokens=1_000_000, completion_tokens=0, cached_prompt_tokens=600_000)
    # 400k fresh at $0.30/M and 600k cached at $0.03/M: $0.12 + $0.018.
    assert cached.llm_cost_micro_usd("m", usage) == 138_000
    # Without a cached rate, a cached token costs what an input one does.
    plain = PriceTable({"m": ModelPrice(input_usd_per_mtok=0.30)})
    assert plain.llm_cost_micro_usd("m", usage) == 300_000
