"""The operator and analyst commands of the operations side:

- `memoryd explain FACT_ID [--org ORG] [--json]`
- `memoryd replay verify [--user U | --all] [--org ORG] [--json]` (exit 1 on a difference, or
  refused with exit 1 when there is nothing to verify)
- `memoryd maintenance run [--job J] [--force]`, `memoryd maintenance status`
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from datetime import timedelta
from functools import partial

from domain.erasure import ErasureScope
from domain.ids import MemoryKey
from memoryd import wiring
from memoryd.analyst.commands import analyst_core, identifier, live_memory, memory_snapshot
from memoryd.analyst.explain import explain_fact, render_explanation
from memoryd.analyst.verify import render_verification, verification_json, verify_memory
from memoryd.ops.maintenance import JOBS, MaintenanceRunner
from memoryd.ops.metrics import MaintenanceMetrics
from memoryd.settings import Settings
from store.write.cluster_jobs import ClusterJobs, JobState
from store.write.maintenance_queries import MaintenanceQueries, MaintenanceRunRow

# `memoryd replay USER` is the shadow replay; `memoryd replay verify` is rewritten to this.
REPLAY_VERIFY = "replay-verify"


def cmd_explain(settings: Settings, args: argparse.Namespace) -> int:
    with analyst_core(settings) as (live, _), memory_snapshot(live) as (c, run_log):
        found = c.memory.facts_by_id([args.fact_id])
        fact = found[0] if found else None
        if fact is None or (args.org and fact.organization_id != args.org):
            print(f"memoryd explain: no fact {args.fact_id}", file=sys.stderr)
            return 1
        # Only the fact's own chain: a memory's whole run log, with every raw model response,
        # can be far bigger than what is printed of it.
        key = fact.key
        history = run_log.fact_history(key, fact.fact_id)
        runs = run_log.runs_with_ids(key, {h.run_id for h in history} | {fact.created_by_run})
        consumed = {e for r in runs for e in r.run.input_event_ids}
        doc = explain_fact(
            fact,
            history,
            runs,
            c.events.events_with_ids(key, consumed | set(fact.provenance.source_event_ids)),
            c.memory.facts_with_ids(key, run_log.superseded(key, fact.fact_id)),
        )
    print(json.dumps(doc, ensure_ascii=False) if args.json else render_explanation(doc))
    return 0


def cmd_replay_verify(settings: Settings, args: argparse.Namespace) -> int:
    if bool(args.user) == bool(args.all) or (args.user and not args.org):
        print("memoryd replay verify: give --org ORG --user U, or --all", file=sys.stderr)
        return 2
    with analyst_core(settings) as (c, _):
        if args.all:
            keys = MaintenanceQueries(c.pool).memories(args.org)
            if not keys:
                # A mistyped organization, or the wrong database: "0 of 0 memories fold" would
                # pass a check that checked nothing.
                where = f"of organization {args.org}" if args.org else "in any organization"
                return _refuse(args, f"no memory {where}")
        else:
            keys = [MemoryKey(args.org, args.user)]
        results = []
        for k in keys:  # each memory as of one moment, or a run committing between reads differs
            with memory_snapshot(c) as (at, run_log):
                if args.user and not MaintenanceQueries(at.pool).holds(k):
                    # An empty log folds to an empty memory: "ok" would pass a mistyped user,
                    # or an erased one, having checked nothing.
                    return _refuse(args, _nothing_of(at, k))
                runs = list(run_log.iter_runs(k))
                results.append(verify_memory(k, runs, live_memory(at, run_log, k)))
    failed = [v for v in results if not v.ok]
    if args.json:
        memories = [verification_json(v) for v in results]
        print(json.dumps({"ok": not failed, "refused": None, "memories": memories}))
    else:
        for v in results:
            print(render_verification(v))
        print(f"{len(results) - len(failed)} of {len(results)} memories fold to live memory")
    return 1 if failed else 0


def _refuse(args: argparse.Namespace, reason: str) -> int:
    """Exit 1 having checked nothing; with --json, a document that says so too, so that a
    script reading stdout does not find it empty (or take a missing verdict for a pass)."""
    print(f"memoryd replay verify: {reason}", file=sys.stderr)
    if args.json:
        print(json.dumps({"ok": False, "refused": reason, "memories": []}))
    return 1


def _nothing_of(c: wiring.Core, key: MemoryKey) -> str:
    """Why no table holds anything of `key` to verify: it was erased, or it never had any."""
    erased = c.erasures.latest(c.subjects(key), ErasureScope.MEMORY)
    if erased is None:
        return f"no memory {key}: no event, no run, no memory row"
    when = "" if erased.erased_at is None else f" at {erased.erased_at.isoformat()}"
    return (
        f"memory {key} was erased (erasure {erased.erasure_id}, {erased.status}{when}):"
        " nothing of it is left to verify"
    )


_JOB = "maintenance-"  # a maintenance job's name among the cluster jobs


def render_job_state(state: JobState, last: MaintenanceRunRow | None) -> str:
    """A cluster job's line, with the error of its last run if it failed and, for a
    maintenance job, what its last run changed."""
    finished = state.last_finished_at.isoformat() if state.last_finished_at else "-"
    lines = [
        (
            f"{state.job:<24} {state.last_outcome or '-':<10}"
            f" started {state.last_started_at.isoformat()} finished {finished}"
        )
    ]
    if last is not None:
        left = f", {last.skipped} left for the next run" if last.skipped else ""
        lines.append(
            f"    last run: {last.users} memories, changes {json.dumps(last.changes)}{left}"
        )
    if state.last_error:
        lines.append(f"    error: {state.last_error[:500]}")
    return "\n".join(lines)


def cmd_maintenance(settings: Settings, args: argparse.Namespace) -> int:
    with wiring.core(settings) as c:
        jobs = ClusterJobs(c.pool, c.clock)
        if args.action == "status":
            states = jobs.states()
            if not states:
                print("no cluster job has run yet")
            queries = MaintenanceQueries(c.pool)
            for state in states:
                print(render_job_state(state, queries.last_run(state.job.removeprefix(_JOB))))
            return 0
        runner = MaintenanceRunner(c, settings.maintenance, MaintenanceMetrics(c.registry))
        every = timedelta(seconds=settings.maintenance.every_s)
        for job in JOBS if args.job == "all" else (args.job,):
            outcome = jobs.run_if_due(
                f"maintenance-{job}", every, partial(runner.run, job), force=args.force
            )
            if outcome.ran and outcome.result is not None:
                r = outcome.result
                left = f", left {r.skipped} for the next run" if r.skipped else ""
                print(
                    f"{job}: changed {r.changed} in {r.users} memories {r.changes}{left}"
                    f" (run {r.run_id})"
                )
            else:
                print(f"{job}: skipped ({outcome.skipped})")
    return 0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("explain", help="why memory holds a fact: its runs, events, gate verdicts")
    p.add_argument("fact_id", type=uuid.UUID)
    p.add_argument("--org", type=identifier, help="only a fact of this organization")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_explain)
    p = sub.add_parser(
        REPLAY_VERIFY,
        help="(memoryd replay verify) fold the run log and compare with live memory",
    )
    p.add_argument("--user", type=identifier)
    p.add_argument("--all", action="store_true")
    p.add_argument(
        "--org", type=identifier, help="the user's organization; with --all, only this one"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_replay_verify)
    p = sub.add_parser("maintenance", help="run the maintenance jobs now, or show their state")
    p.add_argument("action", choices=["run", "status"])
    p.add_argument("--job", choices=[*JOBS, "all"], default="all")
    p.add_argument(
        "--force", action="store_true", help="run even if the job ran within its interval"
    )
    p.set_defaults(fn=cmd_maintenance)


def rewrite_argv(argv: list[str]) -> list[str]:
    """`replay verify ...` -> `replay-verify ...` (a user named "verify": `replay -- verify`)."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] == "--config" else 1
    if argv[i : i + 2] == ["replay", "verify"]:
        return [*argv[:i], REPLAY_VERIFY, *argv[i + 2 :]]
    return argv
