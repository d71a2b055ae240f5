"""The log writer's and the processor's one-shot runs (demo, `--until-idle`, tests) stop once
they have read what the topic held, on a real broker: kafka-python's high watermarks and
positions say so without a round trip."""

from __future__ import annotations

import time

import pytest

from tests.support.builders import key_of, make_event
from tests.support.deployment import Deployment

pytestmark = pytest.mark.integration

IDLE_S = 120.0  # what a run would otherwise wait after the last record


def test_one_shot_runs_stop_once_caught_up_not_after_their_idle_time(
    deployment: Deployment,
) -> None:
    events = [make_event(user, f"I keep {user}'s notes in Notion") for user in ("ada", "bo", "cy")]
    deployment.publish(events)

    started = time.monotonic()
    assert deployment.run_log_writer(idle_s=IDLE_S) == 3
    deployment.run_processor(idle_s=IDLE_S)
    took = time.monotonic() - started

    assert deployment.query("SELECT count(*) FROM context_events") == [(3,)]
    assert deployment.query("SELECT count(*) FROM consolidated_events") == [(3,)]
    assert deployment.with_core(lambda c: c.memory.facts(key_of("ada")))
    # Well under one idle time for the two runs (each waiting it out would take two).
    assert took < IDLE_S / 2
