"""The LLM settings from the environment, as the README's table gives them."""

from __future__ import annotations

import pydantic
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


@pytest.mark.parametrize(
    ("model", "budget"),
    [
        ("gemini-2.5-pro", "0"),  # pro cannot stop thinking
        ("gemini-2.5-pro", "64"),
        ("gemini-2.5-flash-lite", "256"),
        ("gemini-2.5-flash", "30000"),
        ("models/gemini-2.5-pro-preview-06-05", "0"),
    ],
)
def test_a_budget_the_model_refuses_stops_the_process_at_start(
    monkeypatch: pytest.MonkeyPatch, model: str, budget: str
) -> None:
    # The API answers such a budget with a 400, which dead-letters every batch.
    monkeypatch.setenv("MEMORYD_LLM__MODEL", model)
    monkeypatch.setenv("MEMORYD_LLM__THINKING_BUDGET", budget)
    with pytest.raises(pydantic.ValidationError, match="thinking budget"):
        Settings()


@pytest.mark.parametrize(
    ("model", "budget", "taken"),
    [
        ("gemini-2.5-pro", "128", 128),
        ("gemini-2.5-pro", "null", None),
        ("gemini-2.5-flash", "0", 0),
        ("gemini-2.5-flash-lite", "0", 0),
        ("gemini-2.5-flash-lite", "512", 512),
        ("gemini-2.0-flash", "null", None),
    ],
)
def test_a_budget_the_model_takes_is_kept(
    monkeypatch: pytest.MonkeyPatch, model: str, budget: str, taken: int | None
) -> None:
    monkeypatch.setenv("MEMORYD_LLM__MODEL", model)
    monkeypatch.setenv("MEMORYD_LLM__THINKING_BUDGET", budget)
    assert Settings().llm.thinking_budget == taken


@pytest.mark.parametrize(
    ("model", "budget"),
    [("gemini-2.5-flash-lite", 0), ("gemini-2.5-flash", 2048), ("gemini-2.5-pro", 2048)],
)
def test_unset_the_budget_leaves_a_model_that_does_not_think_unasked_not_thinking(
    monkeypatch: pytest.MonkeyPatch, model: str, budget: int
) -> None:
    # A budget turns flash-lite's thinking on, billed as output tokens.
    monkeypatch.delenv("MEMORYD_LLM__THINKING_BUDGET", raising=False)
    monkeypatch.setenv("MEMORYD_LLM__MODEL", model)
    assert Settings().llm.thinking_budget == budget


def test_the_rewrite_call_may_outlast_the_turn_s_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    # Cut at the turn's limit, a call is paid and has no usage to book.
    monkeypatch.setenv("MEMORYD_READ_PATH__REWRITE_TIMEOUT_MS", "300")
    assert Settings().read_path.rewrite_call_timeout_ms > 300
    monkeypatch.setenv("MEMORYD_READ_PATH__REWRITE_CALL_TIMEOUT_MS", "300")
    with pytest.raises(pydantic.ValidationError, match="rewrite_call_timeout_ms"):
        Settings()
