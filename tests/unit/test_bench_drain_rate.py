"""`bench.ingest`'s drain measure times the rows logged after its first look, and says so
when there were none left to time instead of reporting 0 events/s."""

from __future__ import annotations

from bench.ingest import _rows, drain_rate


def test_the_drain_is_timed_over_the_rows_logged_after_the_first_look() -> None:
    assert drain_rate(100_000, 20_000, 4.0) == {
        "timed_events": 80_000,
        "log_events_per_s": 20_000.0,
    }


def test_a_drain_over_before_the_first_look_is_not_measured_rather_than_zero() -> None:
    measured = drain_rate(20_000, 20_000, 0.0)
    assert measured == {"timed_events": 0}
    drain = {"events": 20_000.0, "writers": 2.0, **measured, "writer_cpu_us_per_event": 49.0}
    (rate, cpu) = _rows({"drain": drain})
    assert rate[1].startswith("not measured")
    assert cpu == ["log-writer CPU per event (drain)", "49 us"]
