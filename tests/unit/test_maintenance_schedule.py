"""How often the scheduled maintenance jobs run when ticks and run starts jitter: at the
configured interval, neither half as often nor more often; and the four jobs, all due at
start, do not start on the same tick."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from memoryd.ops.scheduler import add_cluster_jobs, first_tick_offsets_s
from store.write.cluster_jobs import JobOutcome
from tests.support.builders import BASE_TIME


class Scheduler:
    """Keeps the jobs added, as APScheduler's interval trigger would fire them."""

    def __init__(self) -> None:
        self.jobs: dict[str, tuple[Callable[..., None], float, list[Any]]] = {}
        self.first: dict[str, datetime | None] = {}

    def add_job(
        self,
        fn: Callable[..., None],
        _trigger: str,
        *,
        seconds: float,
        args: list[Any],
        id: str,
        next_run_time: datetime | None = None,
        **_: Any,
    ) -> None:
        self.jobs[id] = (fn, seconds, args)
        self.first[id] = next_run_time


class ClusterJobs:
    """`ClusterJobs.run_if_due`'s rule on a clock the test moves: due when the last start is
    at least `every` ago."""

    def __init__(self) -> None:
        self.now = BASE_TIME
        self.started: list[datetime] = []

    def run_if_due(self, job: str, every: timedelta, fn: Callable[[], Any]) -> JobOutcome[Any]:
        if self.started and self.now - self.started[-1] < every:
            return JobOutcome(ran=False, skipped="not due")
        self.started.append(self.now)
        return JobOutcome(ran=True, result=fn())


class Runner:
    def run(self, job: str) -> None:
        pass


def runs_in(every_s: float, hours: float) -> int:
    """How many times one maintenance job runs in `hours`, ticks and starts jittering by up to
    a second either way."""
    scheduler, jobs = Scheduler(), ClusterJobs()
    add_cluster_jobs(scheduler, jobs, None, 15.0, Runner(), every_s, BASE_TIME)
    tick, period, args = scheduler.jobs["maintenance-lifecycle"]
    jitter = random.Random(7)
    for k in range(int(hours * 3600 / period)):
        jobs.now = BASE_TIME + timedelta(seconds=k * period + jitter.uniform(-1.0, 1.0))
        tick(*args)
    return len(jobs.started)


@pytest.mark.parametrize("every_s", [30.0, 60.0])
def test_a_job_whose_interval_is_the_tick_runs_on_every_tick(every_s: float) -> None:
    assert runs_in(every_s, hours=1) == 3600 / every_s


def test_a_job_of_hours_runs_once_an_interval() -> None:
    assert runs_in(6 * 3600.0, hours=48) == 8


@pytest.mark.parametrize(
    ("tick_s", "offsets"),
    [
        (60.0, {"lifecycle": 0.0, "dedupe": 15.0, "retention": 30.0, "index": 45.0}),
        (30.0, {"lifecycle": 0.0, "dedupe": 7.5, "retention": 15.0, "index": 22.5}),
    ],
)
def test_the_jobs_first_ticks_spread_over_one_tick(
    tick_s: float, offsets: dict[str, float]
) -> None:
    assert first_tick_offsets_s(tick_s) == offsets


def test_jobs_all_due_at_start_start_apart_and_stay_apart() -> None:
    scheduler = Scheduler()
    add_cluster_jobs(scheduler, ClusterJobs(), None, 15.0, Runner(), 6 * 3600.0, BASE_TIME)
    maintenance = {k: v for k, v in scheduler.first.items() if k.startswith("maintenance-")}
    assert maintenance == {
        f"maintenance-{job}": BASE_TIME + timedelta(seconds=60 + offset_s)
        for job, offset_s in first_tick_offsets_s(60.0).items()
    }
    starts: list[datetime] = []
    for job_id, first in maintenance.items():  # each job on its own ticks, for two days
        assert first is not None
        tick, period, args = scheduler.jobs[job_id]
        jobs = args[0] = ClusterJobs()
        for k in range(int(48 * 3600 / period)):
            jobs.now = first + timedelta(seconds=k * period)
            tick(*args)
        starts += jobs.started
    assert len(starts) == 4 * 8
    starts.sort()
    assert min(b - a for a, b in itertools.pairwise(starts)) == timedelta(seconds=15)
