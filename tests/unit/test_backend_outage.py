"""The rule that tells the backend being out from a batch at fault (consumers.backend_outage),
as a table of flush outcomes in order: a memory's transient failure, or "answer"."""

from __future__ import annotations

import pytest

from consumers.backend_outage import BackendOutage
from tests.support.builders import key_of

ANSWER = "answer"


def outs(after: int, outcomes: list[str]) -> list[bool]:
    """Whether the backend is out after each outcome."""
    rule = BackendOutage(after)
    seen = []
    for outcome in outcomes:
        if outcome == ANSWER:
            rule.answered()
        else:
            rule.failed(key_of(outcome))
        seen.append(rule.out)
    return seen


@pytest.mark.parametrize(
    ("outcomes", "expected"),
    [
        pytest.param(["ada", "bob", "ada"], [False, False, True], id="every memory fails"),
        pytest.param(["ada"] * 6, [False] * 6, id="one memory alone is never an outage"),
        pytest.param(
            ["ada", ANSWER, "ada", ANSWER, "ada"], [False] * 5, id="a poison batch among answers"
        ),
        pytest.param(
            ["ada", "bob", "ada", "bob", ANSWER, "ada"],
            [False, False, True, True, False, False],
            id="ends on the first answer",
        ),
        pytest.param(
            ["ada", "ada", "ada", "bob"], [False, False, False, True], id="a second memory joins"
        ),
    ],
)
def test_the_backend_is_out_when_the_last_flushes_of_several_memories_all_failed(
    outcomes: list[str], expected: list[bool]
) -> None:
    assert outs(3, outcomes) == expected


def test_an_answer_says_whether_it_ended_an_outage() -> None:
    rule = BackendOutage(2)
    assert rule.answered() is False
    assert rule.failed(key_of("ada")) is False
    assert rule.failed(key_of("bob")) is True
    assert rule.answered() is True
    assert rule.answered() is False


def test_one_failure_is_no_streak() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        BackendOutage(1)


def test_refused_credentials_are_an_outage_at_once_until_an_answer() -> None:
    # One memory alone is enough: a refused key is never a batch's fault.
    rule = BackendOutage(3)
    rule.refused()
    assert rule.out
    assert rule.answered() is True
    assert not rule.out
    assert rule.failed(key_of("ada")) is False


def test_a_failure_other_than_a_refusal_ends_the_refusal_s_outage() -> None:
    # A passing refusal must not make a poison batch failing alone wait for good.
    rule = BackendOutage(3)
    rule.refused()
    assert [rule.failed(key_of("ada")) for _ in range(5)] == [False] * 5
    rule.refused()
    assert rule.out


def test_an_outage_told_by_the_streak_charges_attempts_again_after_its_limit() -> None:
    now = [0.0]
    rule = BackendOutage(2, max_s=60.0, clock=lambda: now[0])
    assert rule.failed(key_of("ada")) is False
    assert rule.failed(key_of("bob")) is True
    now[0] = 60.0
    assert rule.failed(key_of("ada")) is True
    now[0] = 61.0  # two poison batches alone look like this: they go on to their attempts
    assert rule.failed(key_of("bob")) is False
    assert rule.answered() is False
    assert rule.failed(key_of("ada")) is False
    assert rule.failed(key_of("bob")) is True  # a new streak, a new limit


def test_a_refusal_is_not_bounded_by_the_outage_limit() -> None:
    now = [0.0]
    rule = BackendOutage(2, max_s=60.0, clock=lambda: now[0])
    rule.refused()
    now[0] = 3_600.0
    assert rule.out
