"""The pool's checkout check: a round trip only for a connection idle for a while."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from store.postgres import ReuseCheck


class FakeConnection:
    def __init__(self, *, closed: bool = False, broken: bool = False) -> None:
        self.closed, self.broken, self.autocommit = closed, broken, False
        self.statements: list[str] = []

    def execute(self, sql: str) -> None:
        self.statements.append(sql)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("returned_ago", "round_trips"),
    [(None, 1), (0.0, 0), (0.9, 0), (1.0, 1), (60.0, 1)],
)
def test_only_a_connection_idle_for_a_while_is_checked_with_a_round_trip(
    returned_ago: float | None, round_trips: int
) -> None:
    clock = Clock()
    reuse = ReuseCheck(fresh_s=1.0, clock=clock)
    conn: Any = FakeConnection()
    if returned_ago is not None:
        reuse.returned(conn)
        clock.now += returned_ago
    reuse.check(conn)
    assert len(conn.statements) == round_trips
    assert conn.autocommit is False  # left as the pool hands it out


def test_a_second_checkout_after_no_return_is_checked_again() -> None:
    reuse = ReuseCheck(fresh_s=1.0, clock=Clock())
    conn: Any = FakeConnection()
    reuse.returned(conn)
    reuse.check(conn)
    reuse.check(conn)
    assert len(conn.statements) == 1


@pytest.mark.parametrize("state", [{"closed": True}, {"broken": True}])
def test_a_closed_or_broken_connection_is_refused_even_when_fresh(state: dict[str, bool]) -> None:
    reuse = ReuseCheck(fresh_s=1.0, clock=Clock())
    conn: Any = FakeConnection(**state)
    reuse.returned(conn)
    with pytest.raises(psycopg.OperationalError):
        reuse.check(conn)
    assert conn.statements == []
