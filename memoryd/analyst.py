"""The analyst commands: `memoryd history`, `memoryd replay` and `memoryd export`.

Every one of them reads Postgres through a connection whose transactions are READ ONLY
(store.run_log.read_only_dsn): whatever goes wrong, none of them can change live memory.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from memoryd import wiring
from memoryd.replay import (
    FoldedMemory,
    FoldError,
    MemoryDiff,
    ShadowResult,
    batches_by_size,
    batches_like_live,
    diff_memory,
    fold_runs,
    live_image,
    runs_until,
    shadow_consolidate,
)
from memoryd.settings import Settings
from store.records import Fact, FactStatus
from store.run_log import LoggedRun, PostgresRunLog, read_only_dsn
from store.serialization import fact_to_json

EXPORT_FORMAT = "memoryd-export/1"


@contextmanager
def analyst_core(settings: Settings) -> Iterator[tuple[wiring.Core, PostgresRunLog]]:
    postgres = settings.postgres.model_copy(update={"dsn": read_only_dsn(settings.postgres.dsn)})
    with wiring.core(settings.model_copy(update={"postgres": postgres})) as c:
        yield c, PostgresRunLog(c.pool)


def live_memory(c: wiring.Core, run_log: PostgresRunLog, user_id: str) -> FoldedMemory:
    return live_image(
        c.memory.load_state(user_id),
        c.memory.facts(user_id, tuple(FactStatus)),
        run_log.connections(user_id),
    )


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def run_json(logged: LoggedRun, *, full: bool = False) -> dict[str, Any]:
    run = logged.run
    out: dict[str, Any] = {
        "seq": logged.seq,
        "run_id": str(run.run_id),
        "status": run.status.value,
        "started_at": _iso(run.started_at),
        "finished_at": _iso(logged.finished_at),
        "backend": run.backend,
        "model": run.model,
        "prompt_version": run.prompt_version,
        "attempt": run.attempt,
        "base_version": run.base_version,
        "input_event_ids": [str(e) for e in run.input_event_ids],
        "gate": asdict(run.gate),
        "tokens": {
            "prompt": run.usage.prompt_tokens,
            "completion": run.usage.completion_tokens,
        },
        "cost_micro_usd": run.cost_micro_usd,
        "duration_ms": run.duration_ms,
        "error": run.error,
    }
    if full:
        out["output"] = run.output
        out["raw_response"] = run.raw_response
    return out


# -- history ----------------------------------------------------------------------------------


def parse_time(text: str) -> datetime:
    """ISO 8601; a time without an offset is UTC."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from e
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def render_runs(user_id: str, runs: Sequence[LoggedRun]) -> str:
    lines = [f"{len(runs)} run(s) of {user_id}"]
    header = (
        f"{'seq':>5}  {'finished_at':<32}  {'status':<9}  {'backend:model':<34}  "
        f"{'prompt':<14}  {'events':>6}  {'gate a/h/d/r':<12}  {'tokens p/c':<13}  "
        f"{'cost_usd':>10}  run_id"
    )
    lines.append(header)
    for logged in runs:
        r = logged.run
        g = r.gate
        lines.append(
            f"{logged.seq:>5}  {logged.finished_at.isoformat():<32}  {r.status.value:<9}  "
            f"{r.backend + ':' + r.model:<34}  {r.prompt_version:<14}  "
            f"{len(r.input_event_ids):>6}  "
            f"{f'{g.allowed}/{g.held}/{g.discarded}/{g.reinforced}':<12}  "
            f"{f'{r.usage.prompt_tokens}/{r.usage.completion_tokens}':<13}  "
            f"{r.cost_micro_usd / 1e6:>10.6f}  {r.run_id}"
        )
        lines.append(f"{'':>7}events: {', '.join(str(e) for e in r.input_event_ids)}")
        if r.error:
            lines.append(f"{'':>7}error: {r.error}")
    return "\n".join(lines)


def _fact_line(fact: Fact, mark: str = "") -> str:
    scope = f" @{fact.provenance.connection_id}" if fact.provenance.connection_id else ""
    return (
        f"  {mark}[{fact.status.value}] {fact.fact_type.value}/{fact.surface.value}{scope}: "
        f"{fact.content}  ({fact.fact_id})"
    )


def render_memory(memory: FoldedMemory, at: datetime) -> str:
    lines = [
        (
            f"memory of {memory.user_id} at {at.isoformat()}: version {memory.version},"
            f" {memory.runs_folded} run(s) folded"
        ),
        "# Working memory",
        memory.working_memory or "(empty)",
        "# Scaffold",
        json.dumps(dict(memory.scaffold), indent=2, ensure_ascii=False, default=str),
        "# Learned info",
        *([f"  - {x}" for x in memory.learned_info] or ["  (none)"]),
        "# Connections",
    ]
    for connection_id, info in sorted(memory.connections.items()):
        lines.append(f"  {connection_id}:")
        lines.extend(f"    - {x}" for x in info)
    facts = memory.facts_in()
    lines.append(f"# Facts ({len(facts)})")
    lines.extend(_fact_line(f) for f in facts)
    return "\n".join(lines)


def cmd_history(settings: Settings, args: argparse.Namespace) -> int:
    with analyst_core(settings) as (_c, run_log):
        runs = run_log.runs(args.user)
    if args.at is None:
        if args.json:
            print(json.dumps({"user_id": args.user, "runs": [run_json(r) for r in runs]}))
        else:
            print(render_runs(args.user, runs))
        return 0
    at: datetime = args.at
    before = runs_until(runs, at)
    try:
        memory = fold_runs(before, FoldedMemory(user_id=args.user))
    except FoldError as e:
        print(f"memoryd history: the run log does not fold: {e}", file=sys.stderr)
        return 1
    if args.json:
        doc = {
            "user_id": args.user,
            "at": at.isoformat(),
            "runs": [run_json(r) for r in before],
            "memory": memory.to_json(),
        }
        print(json.dumps(doc, ensure_ascii=False, default=str))
    else:
        print(render_memory(memory, at))
    return 0


# -- replay -----------------------------------------------------------------------------------


def _side(left: Any, right: Any) -> dict[str, Any]:
    return {"live": left, "shadow": right}


def diff_json(diff: MemoryDiff) -> dict[str, Any]:
    return {
        "identical": diff.identical,
        "facts_only_live": [fact_to_json(f) for f in diff.only_left],
        "facts_only_shadow": [fact_to_json(f) for f in diff.only_right],
        "facts_changed": [
            {
                "fact_id": str(d.fact_id),
                "content": d.content,
                "fields": {k: _side(*v) for k, v in d.fields.items()},
            }
            for d in diff.changed
        ],
        "working_memory": None if diff.working_memory is None else _side(*diff.working_memory),
        "scaffold": {k: _side(*v) for k, v in diff.scaffold.items()},
        "learned_info": {
            "only_live": list(diff.learned_info[0]),
            "only_shadow": list(diff.learned_info[1]),
        },
        "connections": {
            k: {"only_live": list(v[0]), "only_shadow": list(v[1])}
            for k, v in diff.connections.items()
        },
    }


def replay_json(
    args: argparse.Namespace,
    events: int,
    batches: int,
    shadow: ShadowResult,
    live: FoldedMemory,
    diff: MemoryDiff,
    identity: dict[str, str],
) -> dict[str, Any]:
    return {
        "user_id": args.user,
        **identity,
        "batching": args.batching,
        "max_batch": args.max_batch,
        "events": events,
        "batches": batches,
        "shadow_runs": len(shadow.runs),
        "failed_batches": [
            {"event_ids": [str(e) for e in f.event_ids], "error": f.error} for f in shadow.failed
        ],
        "tokens": {"prompt": shadow.prompt_tokens, "completion": shadow.completion_tokens},
        "cost_micro_usd": shadow.cost_micro_usd,
        "live": {"version": live.version, "facts": len(live.facts)},
        "shadow": {"version": shadow.memory.version, "facts": len(shadow.memory.facts)},
        "diff": diff_json(diff),
        "shadow_memory": shadow.memory.to_json(),
    }


def render_diff(doc: dict[str, Any], diff: MemoryDiff) -> str:
    lines = [
        (
            f"shadow replay of {doc['user_id']}: {doc['events']} event(s) in {doc['batches']}"
            f" batch(es) through {doc['backend']}:{doc['model']} (prompt {doc['prompt_version']}),"
            f" batching {doc['batching']} (max {doc['max_batch']})"
        ),
        (
            f"tokens {doc['tokens']['prompt']} prompt + {doc['tokens']['completion']} completion,"
            f" cost ${doc['cost_micro_usd'] / 1e6:.6f}, failed batches {len(doc['failed_batches'])}"
        ),
        (
            f"live v{doc['live']['version']} {doc['live']['facts']} fact(s);"
            f" shadow v{doc['shadow']['version']} {doc['shadow']['facts']} fact(s)"
        ),
    ]
    lines.extend(f"  failed: {f['error']}" for f in doc["failed_batches"])
    if diff.identical:
        lines.append("no differences")
        return "\n".join(lines)
    lines.append(f"facts only in live ({len(diff.only_left)}):")
    lines.extend(_fact_line(f, "- ") for f in diff.only_left)
    lines.append(f"facts only in shadow ({len(diff.only_right)}):")
    lines.extend(_fact_line(f, "+ ") for f in diff.only_right)
    lines.append(f"facts changed ({len(diff.changed)}):")
    for d in diff.changed:
        lines.append(f"  ~ {d.content}  ({d.fact_id})")
        lines.extend(f"      {k}: {a!r} -> {b!r}" for k, (a, b) in d.fields.items())
    if diff.working_memory is not None:
        lines.append("working memory (--- live, +++ shadow):")
        live_w, shadow_w = diff.working_memory
        udiff = difflib.unified_diff(
            live_w.splitlines(), shadow_w.splitlines(), "live", "shadow", lineterm="", n=1
        )
        lines.extend(f"  {x}" for x in udiff)
    if diff.scaffold:
        lines.append("scaffold:")
        for key, (a, b) in diff.scaffold.items():
            lines.append(f"  {key}: live={json.dumps(a, default=str)}")
            lines.append(f"  {' ' * len(key)}  shadow={json.dumps(b, default=str)}")
    only_live, only_shadow = diff.learned_info
    if only_live or only_shadow:
        lines.append("learned info:")
        lines.extend(f"  - {x}" for x in only_live)
        lines.extend(f"  + {x}" for x in only_shadow)
    for connection_id, (a_only, b_only) in diff.connections.items():
        lines.append(f"connection {connection_id}:")
        lines.extend(f"  - {x}" for x in a_only)
        lines.extend(f"  + {x}" for x in b_only)
    return "\n".join(lines)


def _shadow_settings(settings: Settings, args: argparse.Namespace) -> Settings:
    llm = {"backend": args.backend or settings.llm.backend}
    if args.model:
        llm["model"] = args.model
    return settings.model_copy(update={"llm": settings.llm.model_copy(update=llm)})


def cmd_replay(settings: Settings, args: argparse.Namespace) -> int:
    if args.max_batch is None:
        args.max_batch = settings.processor.max_batch
    with analyst_core(_shadow_settings(settings, args)) as (c, run_log):
        events = [e.event for e in c.events.user_events(args.user)]
        if args.batching == "live":
            batches = batches_like_live(events, run_log.runs(args.user), args.max_batch)
        else:
            batches = batches_by_size(events, args.max_batch)
        backend, consolidator = wiring.consolidation(c)
        shadow = shadow_consolidate(
            args.user,
            batches,
            backend,
            consolidator,
            embedder=c.embedder,
            policy=wiring.candidate_policy(c),
        )
        live = live_memory(c, run_log, args.user)
    diff = diff_memory(live, shadow.memory)
    identity = {
        "backend": backend.name,
        "model": backend.model,
        "prompt_version": backend.prompt_version,
    }
    doc = replay_json(args, len(events), len(batches), shadow, live, diff, identity)
    print(json.dumps(doc, ensure_ascii=False, default=str) if args.json else render_diff(doc, diff))
    return 0


# -- export -----------------------------------------------------------------------------------


def export_document(
    c: wiring.Core, run_log: PostgresRunLog, user_id: str, now: datetime
) -> dict[str, Any]:
    state = c.memory.load_state(user_id)
    history: dict[str, list[dict[str, Any]]] = {}
    for h in run_log.fact_history(user_id):
        history.setdefault(str(h.fact_id), []).append(
            {
                "run_id": str(h.run_id),
                "operation": h.operation,
                "changed_at": _iso(h.changed_at),
                "before": h.before,
                "after": h.after,
            }
        )
    indexed = run_log.indexed_at(user_id)
    facts = [
        {
            **fact_to_json(f),
            "indexed_at": _iso(indexed.get(f.fact_id)),
            "history": history.get(str(f.fact_id), []),
        }
        for f in c.memory.facts(user_id, tuple(FactStatus))
    ]
    return {
        "format": EXPORT_FORMAT,
        "user_id": user_id,
        "exported_at": now.isoformat(),
        "events": [
            {"seq": e.seq, "recorded_at": _iso(e.recorded_at), **e.event.model_dump(mode="json")}
            for e in c.events.user_events(user_id)
        ],
        "runs": [run_json(r, full=True) for r in run_log.runs(user_id)],
        "memory": {
            "organization_id": state.organization_id,
            "version": state.version,
            "updated_at": _iso(state.updated_at),
            "working_memory": state.working_memory,
            "scaffold": dict(state.scaffold),
            "learned_info": list(state.learned_info),
        },
        "connections": {
            x.connection_id: list(x.learned_info) for x in run_log.connections(user_id)
        },
        "facts": facts,
        "ledger": [
            {
                "seq": row.seq,
                "entry_id": str(row.entry.entry_id),
                "run_id": None if row.entry.run_id is None else str(row.entry.run_id),
                "operation": row.entry.operation,
                "model": row.entry.model,
                "units": row.entry.units,
                "cost_micro_usd": row.entry.cost_micro_usd,
                "occurred_at": _iso(row.entry.occurred_at),
            }
            for row in run_log.ledger(user_id)
        ],
        "balance_micro_usd": c.memory.balance(user_id),
    }


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Whole or not at all: a half-written export is worse than none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f, ensure_ascii=False, indent=2, default=str)
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cmd_export(settings: Settings, args: argparse.Namespace) -> int:
    with analyst_core(settings) as (c, run_log):
        doc = export_document(c, run_log, args.user, c.clock())
    out = Path(args.out)
    write_json(out, doc)
    print(
        f"exported {args.user}: {len(doc['events'])} event(s), {len(doc['runs'])} run(s),"
        f" {len(doc['facts'])} fact(s), {len(doc['ledger'])} ledger entr(ies) to {out}"
    )
    return 0


# -- parser -----------------------------------------------------------------------------------


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("history", help="a user's consolidation runs, or memory at a time")
    p.add_argument("user")
    p.add_argument(
        "--at", type=parse_time, help="ISO time: fold the runs committed by then (no offset = UTC)"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_history)
    p = sub.add_parser(
        "replay", help="re-consolidate a user's raw events into a shadow image and diff it"
    )
    p.add_argument("user")
    p.add_argument("--backend", choices=["offline", "gemini"], help="default: llm.backend")
    p.add_argument("--model", help="default: llm.model (gemini only)")
    p.add_argument("--max-batch", type=int, help="default: processor.max_batch")
    p.add_argument(
        "--batching",
        choices=["max-batch", "live"],
        default="max-batch",
        help="cut the log every --max-batch events, or reuse the live runs' batches",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_replay)
    p = sub.add_parser("export", help="a user's events, runs, facts, memory and ledger as JSON")
    p.add_argument("user")
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_export)
