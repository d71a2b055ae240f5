"""`memoryd replay --batching live` with the live backend gives live memory back, also where
memory changed without an input event (lifecycle runs; the duplicate sweep's are made again
by the same code, tested in tests/unit/test_recorded_maintenance.py) and after a fact erasure (whose
redaction of the memory's text it sets apart from the backend's differences)."""

from __future__ import annotations

import json
import threading
from contextlib import closing
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from domain.erasure import REDACTION
from domain.model import FactStatus
from memoryd import wiring
from memoryd.cli import build_parser
from memoryd.erasure import ErasureRequest
from memoryd.ops.maintenance import MaintenanceRunner
from producers.contract import ContextEvent, EventType
from tests.support.builders import key_of, make_event
from tests.support.deployment import Deployment

pytestmark = pytest.mark.integration

USER = "ada"
LIVE_REPLAY = ["replay", "--org", "org-a", USER, "--backend", "offline", "--batching", "live"]


def clock(days: int) -> Any:
    return lambda: datetime.now(UTC) + timedelta(days=days)


def consolidate(deployment: Deployment, events: list[ContextEvent], days: int = 0) -> None:
    """The pipeline, with the processor's clock `days` ahead."""
    deployment.publish(events)
    writer = threading.Thread(target=deployment.run_log_writer, daemon=True)
    writer.start()
    with wiring.core(deployment.settings, clock(days)) as c:
        wiring.processor(c).run_until_idle(idle_s=2.0)
    writer.join(timeout=120)


def maintain(deployment: Deployment, job: str, days: int) -> None:
    with wiring.core(deployment.settings, clock(days)) as c:
        report = MaintenanceRunner(c, c.settings.maintenance).run(job)
    assert report.users == 1, report


def replay(
    deployment: Deployment, capsys: pytest.CaptureFixture[str], *json_flag: str
) -> tuple[int, str]:
    args = build_parser().parse_args([*LIVE_REPLAY, *json_flag])
    code = args.fn(deployment.settings, args)
    return code, capsys.readouterr().out


def statuses(deployment: Deployment) -> dict[str, str]:
    rows = deployment.query("SELECT content, status FROM memory_facts WHERE user_id = %s", (USER,))
    return {str(content): str(status) for content, status in rows}


def test_a_live_replay_makes_the_maintenance_runs_again_in_their_place(
    deployment: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    consolidate(
        deployment,
        [
            make_event(USER, "I work in engineering at Initech"),
            make_event(USER, "I live in Lisbon", minutes=1),
        ],
    )
    maintain(deployment, "lifecycle", days=200)  # never recalled for 200 days: stale
    consolidate(
        deployment,
        [
            make_event(USER, "I am training for the Berlin marathon in April", minutes=2),
            make_event(USER, "My sister Ana lives in Porto", minutes=4),
        ],
        days=201,
    )
    maintain(deployment, "lifecycle", days=300)  # stale for 100 days: archived
    live = statuses(deployment)
    assert live["The user works in engineering at Initech"] == FactStatus.ARCHIVED
    assert live["The user's sister Ana lives in Porto"] == FactStatus.ACTIVE

    code, out = replay(deployment, capsys, "--json")
    doc = json.loads(out)
    assert code == 0
    assert doc["diff"]["identical"], doc["diff"]
    assert doc["maintenance_runs"] == 2
    assert doc["batches"] == 2
    assert doc["erasure"]["events_left_out"] == []
    assert {f["content"]: f["status"] for f in doc["shadow_memory"]["facts"]} == live
    code, out = replay(deployment, capsys)
    assert "maintenance runs made again: 2" in out
    assert "no differences" in out


def test_a_live_replay_after_a_fact_erasure_leaves_its_events_out_and_says_what_it_explains(
    deployment: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    lisbon = make_event(USER, "I live in Lisbon", minutes=1)
    said = [
        make_event(USER, "I work in engineering at Initech"),
        lisbon,
        make_event(USER, "I prefer short answers with code examples", EventType.PREFERENCE),
    ]
    consolidate(deployment, [make_event(USER, "My sister Ana lives in Porto", minutes=-5)])
    consolidate(deployment, said)  # the last run: W holds the fact about to be erased
    [(fact_id,)] = deployment.query(
        "SELECT fact_id FROM memory_facts WHERE content LIKE '%%Lisbon'"
    )
    with wiring.core(deployment.settings) as c, closing(wiring.publisher(c.settings)) as pub:
        wiring.eraser(c, pub).erase_fact(key_of(USER), fact_id, ErasureRequest("test", "asked"))
    [(working_memory,)] = deployment.query(
        "SELECT working_memory FROM user_memory WHERE user_id = %s", (USER,)
    )
    assert REDACTION in working_memory  # what no replay can write again

    code, out = replay(deployment, capsys, "--json")
    doc = json.loads(out)
    assert code == 0
    # Nothing is the backend's: the shadow holds no fact of the erasure's marker.
    assert doc["diff"]["identical"], doc["diff"]
    assert all(REDACTION not in f["content"] for f in doc["shadow_memory"]["facts"])
    assert doc["events"] == len(said)  # of 4 logged
    assert doc["erasure"]["events_left_out"] == [str(lisbon.event_id)]
    explained = doc["erasure"]["diff"]
    assert REDACTION in explained["working_memory"]["live"]
    assert REDACTION not in explained["working_memory"]["shadow"]
    code, out = replay(deployment, capsys)
    assert "1 event(s) a fact erasure redacted left out, as a flush leaves them out" in out
    assert "differences a fact erasure explains, not the backend" in out
