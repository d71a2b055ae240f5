"""The LLM settings from the environment, as the README's table gives them."""

from __future__ import annotations

import pytest

from memoryd.settings import Settings


@pytest.mark.parametrize(("value", "budget"), [("null", None), ("512", 512)])
def test_the_thinking_budget_is_set_or_unset_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str, budget: int | None
) -> None:
    monkeypatch.setenv("MEMORYD_LLM__THINKING_BUDGET", value)
    assert Settings().llm.thinking_budget == budget


def test_the_thinking_budget_is_2048_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEMORYD_LLM__THINKING_BUDGET", raising=False)
    assert Settings().llm.thinking_budget == 2048
