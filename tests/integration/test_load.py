"""A small load run (bench.load) in CI: 2,000 events over 50 users through the real
`memoryd log-writer` and `memoryd processor` processes, and the invariants after it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.ingest import make_events
from bench.load import run_load
from tests.support.deployment import Deployment

pytestmark = pytest.mark.integration

EVENTS, USERS = 2_000, 50


# About 30 s on a quiet machine with two cores; the limit leaves room for a busy one.
@pytest.mark.timeout(900)
def test_a_small_load_run_loses_and_doubles_nothing(deployment: Deployment, tmp_path: Path) -> None:
    events = make_events(EVENTS, USERS, "ci-load")
    result = run_load(deployment.settings, events, USERS, tmp_path, deadline_s=780.0)

    assert result.completed, result.reached
    assert result.invariants["violations"] == {}
    assert (result.invariants["logged"], result.invariants["consolidated"]) == (EVENTS, EVENTS)
    assert (result.invariants["dead_lettered"], result.invariants["memories"]) == (0, USERS)
    assert result.exit_codes == {"log-writer": 0, "processor": 0}
    assert set(result.seconds) == {"published", "logged", "consolidated", "indexed"}
    assert all(mib > 0 for mib in result.peak_rss_mib.values())
