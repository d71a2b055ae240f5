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
