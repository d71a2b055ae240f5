"""`memoryd maintenance status`: a job's line, and what the runbook sends operators there for
(the error of a failed run, what a maintenance run changed)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from memoryd.ops.commands import render_job_state
from store.write.cluster_jobs import JobState
from store.write.maintenance_queries import MaintenanceRunRow

AT = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)


def test_a_failed_job_shows_its_error_and_a_maintenance_job_its_last_changes() -> None:
    failed = JobState("maintenance-index", AT, AT, "failed", None, AT, "Chroma refused: 503")
    last = MaintenanceRunRow(uuid.uuid4(), "index", AT, "failed", 3, {"repaired": 2}, {})
    text = render_job_state(failed, last)
    assert text.splitlines() == [
        f"maintenance-index        failed     started {AT.isoformat()} finished {AT.isoformat()}",
        '    last run: 3 memories, changes {"repaired": 2}',
        "    error: Chroma refused: 503",
    ]
    fine = JobState("retention", AT, None, None, None, AT)
    assert render_job_state(fine, None).splitlines() == [
        f"retention                -          started {AT.isoformat()} finished -"
    ]


def test_a_maintenance_run_that_left_memories_alone_says_how_many() -> None:
    done = JobState("maintenance-dedupe", AT, AT, "succeeded", AT, AT)
    last = MaintenanceRunRow(uuid.uuid4(), "dedupe", AT, "succeeded", 1, {}, {}, skipped=2)
    assert render_job_state(done, last).splitlines()[1] == (
        "    last run: 1 memories, changes {}, 2 left for the next run"
    )
