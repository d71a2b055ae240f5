"""What the analyst commands print: runs, a memory image and a replay's diff, as text or JSON."""

from __future__ import annotations

import argparse
import difflib
import json
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from datetime import date, datetime
from typing import Any

from consumers.replay_result import ShadowResult
from domain.codec import fact_to_json
from domain.ids import MemoryKey
from domain.model import Fact, LoggedRun
from processors.diff import MemoryDiff
from processors.fold import FoldedMemory


def iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def run_json(logged: LoggedRun, *, full: bool = False) -> dict[str, Any]:
    run = logged.run
    out: dict[str, Any] = {
        "seq": logged.seq,
        "run_id": str(run.run_id),
        "status": run.status.value,
        "started_at": iso(run.started_at),
        "finished_at": iso(logged.finished_at),
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


def render_runs(key: MemoryKey, runs: Sequence[LoggedRun]) -> str:
    lines = [f"{len(runs)} run(s) of {key}"]
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


def fact_line(fact: Fact, mark: str = "") -> str:
    scope = f" @{fact.provenance.connection_id}" if fact.provenance.connection_id else ""
    return (
        f"  {mark}[{fact.status.value}] {fact.fact_type.value}/{fact.surface.value}{scope}: "
        f"{fact.content}  ({fact.fact_id})"
    )


def render_memory(memory: FoldedMemory, at: datetime) -> str:
    lines = [
        (
            f"memory of {memory.organization_id}/{memory.user_id} at {at.isoformat()}:"
            f" version {memory.version},"
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
    lines.extend(fact_line(f) for f in facts)
    return "\n".join(lines)


def _side(left: Any, right: Any) -> dict[str, Any]:
    return {"live": _plain(left), "shadow": _plain(right)}


def _plain(value: Any) -> Any:
    """A compared value as JSON has it: a fact's times (updated_at, observed_at, event_date)
    differ as datetimes and dates, which json.dumps refuses."""
    return value.isoformat() if isinstance(value, date | datetime) else value


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
        "version": None if diff.version is None else _side(*diff.version),
        "reordered": list(diff.reordered),
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
        "organization_id": args.org,
        "user_id": args.user,
        **identity,
        "batching": args.batching,
        "max_batch": args.max_batch,
        "events": events,
        "batches": batches,
        "shadow_runs": len(shadow.runs),
        "maintenance_runs": len(shadow.maintenance),
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


def erasure_json(erased: Sequence[uuid.UUID], diff: MemoryDiff) -> dict[str, Any]:
    """The events a fact erasure redacted, left out of the replay, and the differences that
    explains: live memory was written from their text, then redacted."""
    return {"events_left_out": [str(i) for i in erased], "diff": diff_json(diff)}


def render_diff(doc: dict[str, Any], diff: MemoryDiff, by_erasure: MemoryDiff) -> str:
    lines = [
        (
            f"shadow replay of {doc['organization_id']}/{doc['user_id']}: {doc['events']}"
            f" event(s) in {doc['batches']}"
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
    left_out = len(doc["erasure"]["events_left_out"])
    if doc["maintenance_runs"]:
        lines.append(f"maintenance runs made again: {doc['maintenance_runs']}")
    if left_out:
        lines.append(
            f"{left_out} event(s) a fact erasure redacted left out, as a flush leaves them out"
        )
    if diff.identical:
        lines.append("no differences" + ("" if by_erasure.identical else " but an erasure's"))
    else:
        lines.extend(_diff_lines(diff))
    if not by_erasure.identical:
        lines.append(
            "differences a fact erasure explains, not the backend (live memory was written"
            " from the redacted events, then redacted; no replay can make that again):"
        )
        lines.extend(f"  {x}" for x in _diff_lines(by_erasure))
    return "\n".join(lines)


def _diff_lines(diff: MemoryDiff) -> list[str]:
    lines: list[str] = []
    lines.append(f"facts only in live ({len(diff.only_left)}):")
    lines.extend(fact_line(f, "- ") for f in diff.only_left)
    lines.append(f"facts only in shadow ({len(diff.only_right)}):")
    lines.extend(fact_line(f, "+ ") for f in diff.only_right)
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
    return lines
