"""The one retry policy, as a table: attempt and jitter draw in, seconds out."""

from __future__ import annotations

import pytest

from domain.retry import Backoff

PROCESSOR = Backoff(base_s=0.5, max_s=30.0)
NO_JITTER = Backoff(base_s=1.0, max_s=8.0, jitter=0.0)


@pytest.mark.parametrize(
    ("policy", "attempt", "draw", "expected"),
    [
        (PROCESSOR, 0, 0.5, 0.5),  # the middle of the jitter range is the nominal wait
        (PROCESSOR, 1, 0.5, 1.0),
        (PROCESSOR, 5, 0.5, 16.0),
        (PROCESSOR, 6, 0.5, 30.0),  # 32 s capped
        (PROCESSOR, 500, 0.5, 30.0),  # no overflow however many attempts
        (PROCESSOR, 0, 0.0, 0.4),  # -20 %
        (PROCESSOR, 6, 0.0, 24.0),  # the jitter applies to the capped wait too
        (PROCESSOR, 3, 0.999, 4.0 * 1.1996),  # just under +20 %
        (NO_JITTER, 0, 0.0, 1.0),
        (NO_JITTER, 1, 0.9, 2.0),
        (NO_JITTER, 4, 0.1, 8.0),
    ],
)
def test_delay(policy: Backoff, attempt: int, draw: float, expected: float) -> None:
    assert policy.delay(attempt, rand=lambda: draw) == pytest.approx(expected)


def test_delay_stays_within_the_jitter_band() -> None:
    for attempt in range(10):
        nominal = PROCESSOR.nominal(attempt)
        for _ in range(50):
            assert 0.8 * nominal <= PROCESSOR.delay(attempt) <= 1.2 * nominal


@pytest.mark.parametrize(
    ("base_s", "max_s", "jitter"),
    [(0.0, 1.0, 0.2), (2.0, 1.0, 0.2), (1.0, 2.0, 1.0), (1.0, 2.0, -0.1)],
)
def test_bad_policies_are_refused(base_s: float, max_s: float, jitter: float) -> None:
    with pytest.raises(ValueError, match=r"base_s|jitter"):
        Backoff(base_s, max_s, jitter)


def test_a_negative_attempt_is_refused() -> None:
    with pytest.raises(ValueError, match="attempt"):
        PROCESSOR.delay(-1)
