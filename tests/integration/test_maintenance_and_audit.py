"""Maintenance jobs from two processes at once, and the analyst commands on a pipeline run.

- Two `memoryd maintenance run` processes start together: every job runs once in the
  cluster (the other process finds it locked or already done), a forced second run changes
  nothing, and the fold of the run log still equals live memory (`replay verify`).
- `memoryd explain` shows a fact's chain (runs, gate verdicts, events with their source
  metadata); `memoryd replay verify` exits non-zero when live memory was changed behind the
  run log's back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from memoryd import wiring
from memoryd.cli import build_parser
from memoryd.ops.commands import rewrite_argv
from producers.contract import ContextEvent, EventType
from tests.support.builders import make_event, make_fact
from tests.support.deployment import Deployment

pytestmark = pytest.mark.integration
REPO_ROOT = Path(__file__).resolve().parents[2]


def consolidate(
    deployment: Deployment, events: list[ContextEvent], clock_offset: timedelta
) -> None:
    """The pipeline, with the processor's clock `clock_offset` away from now."""
    deployment.publish(events)
    writer = threading.Thread(target=deployment.run_log_writer, daemon=True)
    writer.start()
    with wiring.core(deployment.settings, lambda: datetime.now(UTC) + clock_offset) as c:
        wiring.processor(c).run_until_idle(idle_s=2.0)
    writer.join(timeout=120)


def cli(
    deployment: Deployment, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    args = build_parser().parse_args(rewrite_argv(argv))
    code = args.fn(deployment.settings, args)
    return code, capsys.readouterr().out


def maintenance_process(deployment: Deployment, *extra: str) -> subprocess.Popen[str]:
    s = deployment.settings
    env = {
        **os.environ,
        "MEMORYD_KAFKA__BOOTSTRAP_SERVERS": s.kafka.bootstrap_servers,
        "MEMORYD_KAFKA__TOPIC": s.kafka.topic,
        "MEMORYD_POSTGRES__DSN": s.postgres.dsn,
        "MEMORYD_CHROMA__PATH": str(s.chroma.path),
        "MEMORYD_MAINTENANCE__DUPLICATE_THRESHOLD": "0.6",
        "MEMORYD_LOG_FORMAT": "json",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "memoryd.cli", "maintenance", "run", *extra],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_both(deployment: Deployment, *extra: str) -> list[str]:
    procs = [maintenance_process(deployment, *extra) for _ in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        outs.append(out)
    return outs


def facts_snapshot(deployment: Deployment) -> list[tuple[Any, ...]]:
    return deployment.query(
        "SELECT fact_id, status, version, superseded_by FROM memory_facts ORDER BY fact_id"
    )


def test_maintenance_from_two_processes_runs_once_and_a_second_run_changes_nothing(
    deployment: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    # An old memory (written 200 days ago, never read) and a fresh one with near-duplicates.
    consolidate(
        deployment,
        [
            make_event("old", "I work in engineering at Initech"),
            make_event("old", "I live in Lisbon", minutes=1),
            make_event("old", "I prefer short answers", EventType.PREFERENCE, minutes=2),
        ],
        timedelta(days=-200),
    )
    consolidate(
        deployment,
        [
            make_event("new", "I am training for the Berlin marathon in April"),
            make_event("new", "I train for the marathon in Berlin this April", minutes=1),
            make_event("new", "My sister Ana lives in Porto", minutes=2),
        ],
        timedelta(0),
    )
    deployment.query(  # read audit rows: one past retention, one recent
        "INSERT INTO context_logs (log_id, organization_id, user_id, query, memory_version,"
        " injected, retrieved, latency_ms, degraded, created_at) VALUES"
        " (gen_random_uuid(), 'org-a', 'new', 'q', 1, '{}', '[]', 1, false,"
        "  now() - interval '100 days'),"
        " (gen_random_uuid(), 'org-a', 'new', 'q', 1, '{}', '[]', 1, false, now())"
        " RETURNING log_id"
    )
    before = facts_snapshot(deployment)

    outs = run_both(deployment)

    runs = deployment.query("SELECT job, users, changes FROM maintenance_runs ORDER BY seq")
    assert sorted(r[0] for r in runs) == ["dedupe", "index", "lifecycle", "retention"], (runs, outs)
    by_job = {job: (users, changes) for job, users, changes in runs}
    lifecycle_users, lifecycle_changes = by_job["lifecycle"]
    assert lifecycle_users == 1
    assert sum(lifecycle_changes.values()) >= 3  # every fact of "old" went stale
    assert by_job["retention"][1] == {"context_logs_deleted": 1}
    skipped = "".join(outs).count("skipped (")
    assert by_job["index"][1] == {}  # every fact indexed is in Chroma as Postgres has it
    assert skipped == 4, outs  # each job: one process ran it, the other skipped it

    stale = deployment.query(
        "SELECT count(*) FROM memory_facts WHERE user_id = 'old' AND status <> 'stale'"
    )
    assert stale == [(0,)]
    maintenance_runs = deployment.query(
        "SELECT user_id, model, base_version FROM consolidation_runs"
        " WHERE backend = 'maintenance' ORDER BY seq"
    )
    dedupe_users = by_job["dedupe"][0]
    assert len(maintenance_runs) == lifecycle_users + dedupe_users
    changed = facts_snapshot(deployment)
    assert changed != before

    # A forced second run (both processes again) changes nothing at all.
    run_both(deployment, "--force")
    assert facts_snapshot(deployment) == changed
    again = deployment.query(
        "SELECT job, users, changes FROM maintenance_runs ORDER BY seq OFFSET 3"
    )
    assert again, "the forced run was recorded"
    assert all(users == 0 and changes == {} for _, users, changes in again), again
    assert len(
        deployment.query("SELECT 1 FROM consolidation_runs WHERE backend = 'maintenance'")
    ) == len(maintenance_runs)

    # The maintenance runs fold: the run log still rebuilds live memory exactly.
    code, out = cli(deployment, ["replay", "verify", "--all"], capsys)
    assert code == 0, out
    assert "2 of 2 memories fold to live memory" in out


def test_maintenance_status_says_when_nothing_ran_then_each_job_that_did(
    deployment: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(deployment, ["maintenance", "status"], capsys) == (
        0,
        "no cluster job has run yet\n",
    )
    assert cli(deployment, ["maintenance", "run", "--job", "retention"], capsys)[0] == 0
    code, out = cli(deployment, ["maintenance", "status"], capsys)
    assert code == 0
    line, last = out.splitlines()
    assert line.split()[:2] == ["maintenance-retention", "succeeded"], out
    assert last.startswith("    last run: 0 memories, changes {"), out  # what it changed


def test_explain_and_replay_verify_on_a_pipeline_run(
    deployment: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    consolidate(
        deployment,
        [
            make_event(
                "ada", "I work in engineering at Initech", message_id="m-1", session_id="s-1"
            ),
            make_event("ada", "I live in Lisbon", minutes=1, message_id="m-2", session_id="s-1"),
        ],
        timedelta(0),
    )
    consolidate(
        deployment,
        [
            make_event(
                "ada",
                "Actually I moved to Porto last month",
                EventType.CORRECTION,
                minutes=5,
                message_id="m-3",
                session_id="s-2",
            )
        ],
        timedelta(0),
    )
    code, out = cli(
        deployment, ["replay", "verify", "--org", "org-a", "--user", "ada", "--json"], capsys
    )
    assert code == 0, out
    assert json.loads(out)["memories"][0]["ok"] is True

    fact_id, content = deployment.query(
        "SELECT fact_id, content FROM memory_facts WHERE user_id = 'ada'"
        " ORDER BY reinforce_count DESC, created_at LIMIT 1"
    )[0]
    code, out = cli(deployment, ["explain", str(fact_id), "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["fact"]["content"] == content
    created = [r for r in doc["runs"] if r["created_the_fact"]]
    assert len(created) == 1
    assert created[0]["backend"] == "offline"
    assert created[0]["gate_verdicts"], "the gate's verdict on the fact is in its chain"
    cited = [e for e in doc["events"] if e["cited_as_evidence"]]
    assert cited
    assert all(e["source_metadata"]["session_id"].startswith("s-") for e in cited)
    assert all("message_id" in e["source_metadata"] for e in cited)
    code, text = cli(deployment, ["explain", str(fact_id)], capsys)
    assert code == 0
    assert content in text
    assert "(created it)" in text
    code, _ = cli(deployment, ["explain", str(fact_id), "--org", "another-org"], capsys)
    assert code == 1

    # Live memory changed behind the run log's back: verify says so and exits non-zero.
    deployment.query(
        "UPDATE user_memory SET working_memory = 'edited by hand' WHERE user_id = 'ada'"
        " RETURNING user_id"
    )
    code, out = cli(deployment, ["replay", "verify", "--all"], capsys)
    assert code == 1
    assert "DIFF" in out
    assert "working memory differs" in out


def test_replay_verify_all_sees_memories_with_only_facts_or_only_events(
    deployment: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    consolidate(deployment, [make_event("ada", "I live in Lisbon")], timedelta(0))
    imported = make_fact("bo", "Bo plays the cello", org="org-b")  # no run made it

    def seed(c: wiring.Core) -> None:
        c.memory.insert_facts([imported])
        c.events.append([(make_event("cy", "I prefer tea", org="org-b"), None)])

    deployment.with_core(seed)
    code, out = cli(deployment, ["replay", "verify", "--all", "--json"], capsys)
    assert code == 1, out
    verdicts = {(m["organization_id"], m["user_id"]): m["ok"] for m in json.loads(out)["memories"]}
    assert verdicts == {("org-a", "ada"): True, ("org-b", "bo"): False, ("org-b", "cy"): True}
    code, out = cli(deployment, ["replay", "verify", "--all", "--org", "org-b"], capsys)
    assert code == 1
    assert "DIFF org-b/bo: 1 fact(s) only live" in out
    assert "2 memories" in out.splitlines()[-1]
