"""`memoryd export`: a memory's events, runs, memory, facts with their history, ledger and
read audit.

A memory's history can be long (100,000 events, as many runs with their raw responses, a
read audit row per chat turn): its long sections are iterators over server-side reads, and
`write_json` writes each element as it is read, so an export takes bounded memory. They read
the database while the export is written: keep both inside one `store.postgres.snapshot`.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from domain.codec import fact_to_json
from domain.ids import MemoryKey
from memoryd import wiring
from memoryd.analyst.render import iso, run_json
from store.read.fact_queries import PostgresReadModel
from store.write.run_log import LedgerRow, PostgresRunLog

EXPORT_FORMAT = "memoryd-export/1"
# The sections read as they are written, in the export's order.
STREAMED = ("events", "runs", "facts", "ledger", "context_logs")


class Counted(Iterator[Any]):
    """An export section read as it is written, counting what it gave."""

    def __init__(self, items: Iterable[Any]) -> None:
        self._items = iter(items)
        self.count = 0

    def __next__(self) -> Any:
        item = next(self._items)
        self.count += 1
        return item

    def close(self) -> None:
        """End a section left half read: its cursor's transaction ends now, in order, not
        when the garbage collector gets to it after the snapshot is gone."""
        close = getattr(self._items, "close", None)
        if close is not None:
            close()


def export_sections(
    c: wiring.Core, run_log: PostgresRunLog, key: MemoryKey, now: datetime
) -> dict[str, Any]:
    """The export, its `STREAMED` sections as `Counted` iterators (see the module's doc)."""
    state = c.memory.load_state(key)
    return {
        "format": EXPORT_FORMAT,
        "organization_id": key.organization_id,
        "user_id": key.user_id,
        "exported_at": now.isoformat(),
        "events": Counted(
            {"seq": e.seq, "recorded_at": iso(e.recorded_at), **e.event.model_dump(mode="json")}
            for e in c.events.iter_user_events(key)
        ),
        "runs": Counted(run_json(r, full=True) for r in run_log.iter_runs(key, raw_response=True)),
        "memory": {
            "organization_id": state.organization_id,
            "version": state.version,
            "updated_at": iso(state.updated_at),
            "working_memory": state.working_memory,
            "scaffold": dict(state.scaffold),
            "learned_info": list(state.learned_info),
        },
        "connections": {x.connection_id: list(x.learned_info) for x in run_log.connections(key)},
        "facts": Counted(
            {
                **fact_to_json(fact),
                "indexed_at": iso(fact.indexed_at),
                "history": [
                    {
                        "run_id": str(h.run_id),
                        "operation": h.operation,
                        "changed_at": iso(h.changed_at),
                        "before": h.before,
                        "after": h.after,
                    }
                    for h in history
                ],
            }
            for fact, history in run_log.facts_with_history(key)
        ),
        "ledger": Counted(_ledger_json(row) for row in run_log.iter_ledger(key)),
        "balance_micro_usd": c.memory.balance(key),
        # What each chat turn was shown of the memory, oldest first (the read audit).
        "context_logs": Counted(PostgresReadModel(c.pool, c.subjects).iter_context_logs(key)),
    }


def export_document(
    c: wiring.Core, run_log: PostgresRunLog, key: MemoryKey, now: datetime
) -> dict[str, Any]:
    """The export as one document in memory: for a memory known to be small."""
    return {
        k: list(v) if isinstance(v, Iterator) else v
        for k, v in export_sections(c, run_log, key, now).items()
    }


def _ledger_json(row: LedgerRow) -> dict[str, Any]:
    return {
        "seq": row.seq,
        "entry_id": str(row.entry.entry_id),
        "run_id": None if row.entry.run_id is None else str(row.entry.run_id),
        "operation": row.entry.operation,
        "model": row.entry.model,
        "units": row.entry.units,
        "cost_micro_usd": row.entry.cost_micro_usd,
        "occurred_at": iso(row.entry.occurred_at),
    }


def write_json(path: Path, doc: Mapping[str, Any]) -> None:
    """Whole or not at all: a half-written export is worse than none. A value that is an
    iterator is written as an array, element by element as it is read; the text is the same
    as `json.dump(doc, indent=2)` would write of the values listed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            _write_object(f, doc)
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _json(value: Any, indent: str) -> str:
    # A JSON text holds no raw line break (strings escape theirs): indenting its lines
    # nests it exactly as `json.dump` nests a value.
    text = json.dumps(value, ensure_ascii=False, indent=2, default=str)
    return text.replace("\n", "\n" + indent)


def _write_object(f: IO[str], doc: Mapping[str, Any]) -> None:
    f.write("{")
    for i, (name, value) in enumerate(doc.items()):
        f.write(f"{',' if i else ''}\n  {_json(name, '')}: ")
        if isinstance(value, Iterator):
            _write_array(f, value)
        else:
            f.write(_json(value, "  "))
    f.write("\n}" if doc else "}")


def _write_array(f: IO[str], items: Iterator[Any]) -> None:
    empty = True
    try:
        for item in items:
            f.write(f"{'[' if empty else ','}\n    {_json(item, '    ')}")
            empty = False
    finally:
        if isinstance(items, Counted):
            items.close()
    f.write("[]" if empty else "\n  ]")
