"""The thinking budgets each Gemini 2.5 family takes, checked before any call is made.

A 2.5 model's thinking counts against its output cap, and the API refuses a budget out of the
family's range with a 400, which the consolidation rightly treats as permanent: a budget the
model refuses would send every batch to the dead letters, so it is refused at start-up
instead. Families not listed here (older models, later ones steered otherwise) are not
checked.
"""

from __future__ import annotations

from dataclasses import dataclass

# What a consolidation's thinking may use unless told otherwise: room to reason about a batch,
# well inside the default output cap of 8,192 tokens.
DEFAULT_THINKING_BUDGET = 2_048


@dataclass(frozen=True)
class ThinkingRange:
    least: int  # the smallest budget taken other than 0
    most: int
    can_stop: bool  # a budget of 0 turns thinking off
    thinks_unasked: bool  # thinks when the request sets no budget


# Longest name first: "gemini-2.5-flash-lite" also contains "gemini-2.5-flash".
_FAMILIES: tuple[tuple[str, ThinkingRange], ...] = (
    ("gemini-2.5-flash-lite", ThinkingRange(512, 24_576, can_stop=True, thinks_unasked=False)),
    ("gemini-2.5-flash", ThinkingRange(1, 24_576, can_stop=True, thinks_unasked=True)),
    ("gemini-2.5-pro", ThinkingRange(128, 32_768, can_stop=False, thinks_unasked=True)),
)


def thinking_range(model: str) -> ThinkingRange | None:
    """The budgets `model` takes (by family: previews and `models/` names included)."""
    for family, budgets in _FAMILIES:
        if family in model:
            return budgets
    return None


def check_thinking_budget(model: str, budget: int | None) -> None:
    """Raises ValueError for a budget the model's family would refuse."""
    budgets = thinking_range(model)
    if budgets is None or budget is None:
        return
    if budget == 0 and not budgets.can_stop:
        raise ValueError(
            f"{model} cannot think 0 tokens: its thinking budget is"
            f" {budgets.least}..{budgets.most}, or null for the model's own default"
        )
    if budget != 0 and not budgets.least <= budget <= budgets.most:
        stop = "0 (no thinking) or " if budgets.can_stop else ""
        raise ValueError(
            f"{model} takes a thinking budget of {stop}{budgets.least}..{budgets.most},"
            f" not {budget}"
        )


def default_thinking_budget(model: str) -> int:
    """The consolidation's budget when none is set: a family that does not think unasked is
    left not thinking (0: a budget would turn thinking on, and bill it); any other is bounded
    (a model that takes no budget at all is configured with null)."""
    budgets = thinking_range(model)
    return 0 if budgets is not None and not budgets.thinks_unasked else DEFAULT_THINKING_BUDGET


def most_thinking(model: str, budget: int | None) -> int:
    """The most a call may think: its budget; with none, its family's most if it thinks
    unasked (0 for a family not listed, none known)."""
    if budget is not None:
        return budget
    budgets = thinking_range(model)
    return budgets.most if budgets is not None and budgets.thinks_unasked else 0


def least_thinking(model: str) -> int | None:
    """The smallest budget the model takes: 0 where thinking can be turned off, else its
    minimum; None for a family not listed (no budget sent)."""
    budgets = thinking_range(model)
    if budgets is None:
        return None
    return 0 if budgets.can_stop else budgets.least
