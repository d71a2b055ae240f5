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


@pytest.mark.parametrize(
    ("env", "timeout_ms"),
    [
        pytest.param({}, 215_000, id="16384 answer tokens and 2048 of thinking"),
        pytest.param({"MAX_OUTPUT_TOKENS": "32768"}, 379_000, id="a larger answer"),
        pytest.param({"THINKING_BUDGET": "0"}, 194_000, id="no thinking"),
        pytest.param(
            {"MODEL": "gemini-2.5-pro", "THINKING_BUDGET": "null"},
            522_000,
            id="the model's own thinking, up to its most",
        ),
        pytest.param({"TIMEOUT_MS": "60000"}, 60_000, id="set"),
    ],
)
def test_the_call_timeout_lets_the_largest_allowed_answer_finish_unless_set(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], timeout_ms: int
) -> None:
    """A call cut by its timeout is paid for and books nothing, nor do its retries: unset,
    the timeout gives the room the answer and thinking have 30 s and 10 ms a token."""
    for name in ("MODEL", "MAX_OUTPUT_TOKENS", "THINKING_BUDGET", "TIMEOUT_MS"):
        monkeypatch.delenv(f"MEMORYD_LLM__{name}", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(f"MEMORYD_LLM__{name}", value)
    assert Settings().llm.timeout_ms == timeout_ms
