"""`memoryd explain FACT_ID`: why memory holds a fact.

The chain, from the fact back to what was said: the fact as stored; every run that created
or changed it (from `fact_history` and `created_by_run`), in log order, with what each changed;
the write-gate verdicts those runs gave about it; the events those runs consumed, with their
source metadata (session, message, connection, tool, attachment); the facts it superseded and
the one that superseded it. Read-only, like every analyst command.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from domain.codec import fact_to_json
from domain.model import Fact, LoggedEvent, LoggedRun
from producers.contract import ContextEvent
from store.write.run_log import FactHistoryEntry


def _gate_verdicts(run: LoggedRun, fact: Fact) -> list[dict[str, Any]]:
    """The gate decisions of a run about this fact: by id, or by its content when discarded
    (a discard names no fact). A decision naming another fact is that one's, whatever its
    wording: the same text in another connection's scope is another fact."""
    decisions = (run.run.output or {}).get("gate_decisions") or []
    fid = str(fact.fact_id)
    return [
        dict(d)
        for d in decisions
        if isinstance(d, Mapping)
        and (
            d.get("fact_id") == fid
            or (d.get("fact_id") is None and d.get("content") == fact.content)
        )
    ]


def _maintenance(run: LoggedRun, fact: Fact) -> list[dict[str, Any]]:
    rules = ((run.run.output or {}).get("maintenance") or {}).get("rules") or []
    return [
        dict(r) for r in rules if isinstance(r, Mapping) and r.get("fact_id") == str(fact.fact_id)
    ]


def _event_json(logged: LoggedEvent[ContextEvent]) -> dict[str, Any]:
    e = logged.event
    return {
        "event_id": str(e.event_id),
        "seq": logged.seq,
        "event_type": e.event_type.value,
        "content": e.content,
        "occurred_at": e.occurred_at.isoformat(),
        "recorded_at": logged.recorded_at.isoformat(),
        "source_metadata": e.source_metadata.model_dump(mode="json", exclude_none=True),
    }


def explain_fact(
    fact: Fact,
    history: Sequence[FactHistoryEntry],
    runs: Sequence[LoggedRun],
    events: Sequence[LoggedEvent[ContextEvent]],
    related: Sequence[Fact],
) -> dict[str, Any]:
    """`runs` and `events` may be all of the user's: only the chain of this fact is kept."""
    changed_by = {h.run_id for h in history} | {fact.created_by_run}
    chain = [r for r in runs if r.run.run_id in changed_by]
    consumed = {e for r in chain for e in r.run.input_event_ids}
    evidence = set(fact.provenance.source_event_ids)
    by_run: dict[uuid.UUID, list[FactHistoryEntry]] = {}
    for h in history:
        by_run.setdefault(h.run_id, []).append(h)
    return {
        "fact": fact_to_json(fact),
        "runs": [
            {
                "seq": r.seq,
                "run_id": str(r.run.run_id),
                "finished_at": r.finished_at.isoformat(),
                "status": r.run.status.value,
                "backend": r.run.backend,
                "model": r.run.model,
                "prompt_version": r.run.prompt_version,
                "created_the_fact": r.run.run_id == fact.created_by_run,
                "changes": [
                    {
                        "operation": h.operation,
                        "changed_at": h.changed_at.isoformat(),
                        "before": _summary(h.before),
                        "after": _summary(h.after),
                    }
                    for h in by_run.get(r.run.run_id, [])
                ],
                "gate_verdicts": _gate_verdicts(r, fact),
                "maintenance_rules": _maintenance(r, fact),
                "input_event_ids": [str(e) for e in r.run.input_event_ids],
            }
            for r in chain
        ],
        "events": [
            {**_event_json(e), "cited_as_evidence": e.event.event_id in evidence}
            for e in events
            if e.event.event_id in consumed or e.event.event_id in evidence
        ],
        "missing_events": sorted(
            str(i) for i in (consumed | evidence) - {e.event.event_id for e in events}
        ),
        "superseded_by": None if fact.superseded_by is None else str(fact.superseded_by),
        "supersedes": [
            {"fact_id": str(f.fact_id), "content": f.content, "status": f.status.value}
            for f in related
            if f.superseded_by == fact.fact_id
        ],
    }


_SUMMARY_FIELDS = ("content", "status", "confidence", "salience", "reinforce_count", "version")


def _summary(doc: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if doc is None else {k: doc.get(k) for k in _SUMMARY_FIELDS}


def render_explanation(doc: Mapping[str, Any]) -> str:
    f = doc["fact"]
    lines = [
        f"fact {f['fact_id']} of {f['organization_id']}/{f['user_id']}",
        f"  [{f['status']}] {f['fact_type']}/{f['surface']}: {f['content']}",
        (
            f"  confidence {f['confidence']}, salience {f['salience']},"
            f" reinforced {f['reinforce_count']}x, recalled {f['recall_count']}x,"
            f" version {f['version']}"
        ),
    ]
    if doc["superseded_by"]:
        lines.append(f"  superseded by {doc['superseded_by']}")
    lines.extend(
        f"  supersedes {s['fact_id']} [{s['status']}]: {s['content']}" for s in doc["supersedes"]
    )
    lines.append(f"runs ({len(doc['runs'])}):")
    for r in doc["runs"]:
        made = " (created it)" if r["created_the_fact"] else ""
        lines.append(
            f"  #{r['seq']} {r['finished_at']} {r['backend']}:{r['model']}"
            f" prompt {r['prompt_version']} run {r['run_id']}{made}"
        )
        for c in r["changes"]:
            before = c["before"] or {}
            after = c["after"] or {}
            moved = f"{before.get('status')} -> {after.get('status')}" if before else "new"
            lines.append(f"      {c['operation']}: {moved}, v{after.get('version')}")
        for g in r["gate_verdicts"]:
            lines.append(f"      gate {g.get('op')} -> {g.get('verdict')}: {g.get('reason')}")
        for m in r["maintenance_rules"]:
            lines.append(f"      rule {m.get('rule')}")
    lines.append(f"events ({len(doc['events'])}):")
    for e in doc["events"]:
        mark = "*" if e["cited_as_evidence"] else " "
        meta = ", ".join(f"{k}={v}" for k, v in e["source_metadata"].items())
        lines.append(f"  {mark} {e['occurred_at']} {e['event_type']} ({meta}): {e['content']}")
    lines.extend(
        f"  ? {i} (not in the log: erased, or not logged yet)" for i in doc["missing_events"]
    )
    lines.append("(* = cited by the fact as evidence)")
    return "\n".join(lines)
