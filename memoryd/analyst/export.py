"""`memoryd export`: a memory's events, runs, memory, facts with their history, ledger and
read audit."""

from __future__ import annotations

import json
import os
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from domain.codec import fact_to_json
from domain.ids import MemoryKey
from domain.model import FactStatus
from memoryd import wiring
from memoryd.analyst.render import iso, run_json
from store.read.fact_queries import PostgresReadModel
from store.write.run_log import PostgresRunLog

EXPORT_FORMAT = "memoryd-export/1"


def export_document(
    c: wiring.Core, run_log: PostgresRunLog, key: MemoryKey, now: datetime
) -> dict[str, Any]:
    state = c.memory.load_state(key)
    history: dict[str, list[dict[str, Any]]] = {}
    for h in run_log.fact_history(key):
        history.setdefault(str(h.fact_id), []).append(
            {
                "run_id": str(h.run_id),
                "operation": h.operation,
                "changed_at": iso(h.changed_at),
                "before": h.before,
                "after": h.after,
            }
        )
    indexed = run_log.indexed_at(key)
    facts = [
        {
            **fact_to_json(f),
            "indexed_at": iso(indexed.get(f.fact_id)),
            "history": history.get(str(f.fact_id), []),
        }
        for f in c.memory.facts(key, tuple(FactStatus))
    ]
    return {
        "format": EXPORT_FORMAT,
        "organization_id": key.organization_id,
        "user_id": key.user_id,
        "exported_at": now.isoformat(),
        "events": [
            {"seq": e.seq, "recorded_at": iso(e.recorded_at), **e.event.model_dump(mode="json")}
            for e in c.events.user_events(key)
        ],
        "runs": [run_json(r, full=True) for r in run_log.runs(key)],
        "memory": {
            "organization_id": state.organization_id,
            "version": state.version,
            "updated_at": iso(state.updated_at),
            "working_memory": state.working_memory,
            "scaffold": dict(state.scaffold),
            "learned_info": list(state.learned_info),
        },
        "connections": {x.connection_id: list(x.learned_info) for x in run_log.connections(key)},
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
                "occurred_at": iso(row.entry.occurred_at),
            }
            for row in run_log.ledger(key)
        ],
        "balance_micro_usd": c.memory.balance(key),
        # What each chat turn was shown of the memory, oldest first (the read audit).
        "context_logs": list(reversed(PostgresReadModel(c.pool).context_logs(key, limit=None))),
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
