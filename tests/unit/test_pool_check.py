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
    ("checked_out_ago", "round_trips"),
    [(0.0, 0), (0.9, 0), (1.0, 1), (60.0, 1)],
)
def test_only_a_connection_idle_for_a_while_is_checked_with_a_round_trip(
    checked_out_ago: float, round_trips: int
) -> None:
    clock = Clock()
    reuse = ReuseCheck(fresh_s=1.0, clock=clock)
    conn: Any = FakeConnection()
    reuse.check(conn)
    clock.now += checked_out_ago
    conn.statements.clear()
    reuse.check(conn)
    assert len(conn.statements) == round_trips
    assert conn.autocommit is False  # left as the pool hands it out


def test_a_connection_never_checked_out_is_checked_with_a_round_trip() -> None:
    conn: Any = FakeConnection()
    ReuseCheck(fresh_s=1.0, clock=Clock()).check(conn)
    assert len(conn.statements) == 1


def test_each_checkout_restarts_the_clock() -> None:
    clock = Clock()
    reuse = ReuseCheck(fresh_s=1.0, clock=clock)
    conn: Any = FakeConnection()
    for _ in range(5):
        reuse.check(conn)
        clock.now += 0.6  # never 1 s from the previous checkout, 3 s from the first
    assert len(conn.statements) == 1


@pytest.mark.parametrize("state", [{"closed": True}, {"broken": True}])
def test_a_closed_or_broken_connection_is_refused_even_when_fresh(state: dict[str, bool]) -> None:
    reuse = ReuseCheck(fresh_s=1.0, clock=Clock())
    conn: Any = FakeConnection()
    reuse.check(conn)
    for name, value in state.items():
        setattr(conn, name, value)
    conn.statements.clear()
    with pytest.raises(psycopg.OperationalError):
        reuse.check(conn)
    assert conn.statements == []
