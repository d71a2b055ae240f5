"""Mapping between the memory values and their rows (`memory_facts`, `user_memory`), and the
upsert a run makes."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from domain.codec import fact_to_json
from domain.model import (
    Fact,
    FactChange,
    FactStatus,
    FactType,
    MemoryState,
    Provenance,
    SurfacePolicy,
)
from domain.upsert import RUN_OVERWRITES
from store.errors import StoreError

COLUMNS = (
    "fact_id, user_id, organization_id, content, context_type, source, connection_id, tool_id,"
    " message_id, attachment_id, filename, source_event_ids, fact_type, surface, status, pinned,"
    " confidence, salience, reinforce_count, last_reinforced_at, recall_count, last_recalled_at,"
    " superseded_by, created_by_run, created_at, updated_at, indexed_at, version,"
    " observed_at, event_date, subject"
)

# Where fact rows are read from: `memory_facts` with each fact's recalls added up (the chat
# turns count them in `fact_recalls`, migration 0009). Writes go to `memory_facts`.
READ_FROM = "memory_fact_rows"

# On conflict the row takes what a run overwrites (domain.upsert, the fold's rule too) and
# keeps the rest, such as when and by which run it was first created.
_UPSERT = (
    f"INSERT INTO memory_facts ({COLUMNS}, updated_by_run) VALUES ("
    + ", ".join(["%s"] * 32)
    + ") ON CONFLICT (fact_id) DO UPDATE SET "
    + ", ".join(f"{column} = EXCLUDED.{column}" for column in RUN_OVERWRITES)
    + ", indexed_at = NULL, version = memory_facts.version + 1,"
    " updated_by_run = EXCLUDED.updated_by_run WHERE NOT memory_facts.pinned"
    " AND memory_facts.organization_id = EXCLUDED.organization_id"
    " AND memory_facts.user_id = EXCLUDED.user_id"
)


# The `user_memory` columns `state_from_row` reads, in its order.
STATE_COLUMNS = (
    "organization_id, working_memory, information_scaffold, persistent_learned_info, version,"
    " updated_at"
)


def state_from_row(user_id: str, row: Sequence[Any]) -> MemoryState:
    org, w, s, learned, version, updated_at = row
    return MemoryState(
        user_id=user_id,
        organization_id=org,
        working_memory=w,
        scaffold=s,
        learned_info=tuple(learned),
        version=version,
        updated_at=updated_at,
    )


def from_row(row: Sequence[Any]) -> Fact:
    (
        fact_id,
        user_id,
        org,
        content,
        context_type,
        source,
        connection_id,
        tool_id,
        message_id,
        attachment_id,
        filename,
        source_event_ids,
        fact_type,
        surface,
        status,
        pinned,
        confidence,
        salience,
        reinforce_count,
        last_reinforced_at,
        recall_count,
        last_recalled_at,
        superseded_by,
        created_by_run,
        created_at,
        updated_at,
        indexed_at,
        version,
        observed_at,
        event_date,
        subject,
    ) = row
    return Fact(
        fact_id=fact_id,
        user_id=user_id,
        organization_id=org,
        content=content,
        fact_type=FactType(fact_type),
        surface=SurfacePolicy(surface),
        status=FactStatus(status),
        pinned=pinned,
        confidence=float(confidence),
        salience=float(salience),
        provenance=Provenance(
            context_type=context_type,
            source=source,
            connection_id=connection_id,
            tool_id=tool_id,
            message_id=message_id,
            attachment_id=attachment_id,
            filename=filename,
            source_event_ids=tuple(source_event_ids),
        ),
        created_by_run=created_by_run,
        created_at=created_at,
        updated_at=updated_at,
        reinforce_count=reinforce_count,
        last_reinforced_at=last_reinforced_at,
        recall_count=recall_count,
        last_recalled_at=last_recalled_at,
        superseded_by=superseded_by,
        indexed_at=indexed_at,
        version=version,
        observed_at=observed_at,
        event_date=event_date,
        subject=subject,
    )


def _params(fact: Fact, run_id: uuid.UUID) -> tuple[Any, ...]:
    p = fact.provenance
    return (
        fact.fact_id,
        fact.user_id,
        fact.organization_id,
        fact.content,
        p.context_type,
        p.source,
        p.connection_id,
        p.tool_id,
        p.message_id,
        p.attachment_id,
        p.filename,
        list(p.source_event_ids),
        fact.fact_type.value,
        fact.surface.value,
        fact.status.value,
        fact.pinned,
        fact.confidence,
        fact.salience,
        fact.reinforce_count,
        fact.last_reinforced_at,
        fact.recall_count,
        fact.last_recalled_at,
        fact.superseded_by,
        fact.created_by_run,
        fact.created_at,
        fact.updated_at,
        None,
        fact.version,
        fact.observed_at,
        fact.event_date,
        fact.subject,
        run_id,
    )


def missing(conn: psycopg.Connection[Any], fact_ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
    """The ids among these that no row holds (erased, or never written), in their order."""
    rows = conn.execute(
        "SELECT fact_id FROM memory_facts WHERE fact_id = ANY(%s)", (list(fact_ids),)
    ).fetchall()
    present = {r[0] for r in rows}
    return [f for f in fact_ids if f not in present]


def insert_new(conn: psycopg.Connection[Any], facts: Sequence[Fact]) -> int:
    """Insert facts whose id is not stored yet, as they are (pending indexing); returns how
    many were inserted. One COPY into a temporary table, then one INSERT ... SELECT."""
    if not facts:
        return 0
    conn.execute(
        "CREATE TEMPORARY TABLE fact_import (LIKE memory_facts INCLUDING DEFAULTS) ON COMMIT DROP"
    )
    with conn.cursor().copy(f"COPY fact_import ({COLUMNS}, updated_by_run) FROM STDIN") as copy:
        for fact in facts:
            copy.write_row(_params(fact, fact.created_by_run))
    rows = conn.execute(
        f"INSERT INTO memory_facts ({COLUMNS}, updated_by_run)"
        f" SELECT {COLUMNS}, updated_by_run FROM fact_import ON CONFLICT (fact_id) DO NOTHING"
        " RETURNING fact_id"
    ).fetchall()
    return len(rows)


def lock_in_id_order(conn: psycopg.Connection[Any], fact_ids: Iterable[uuid.UUID]) -> None:
    """Lock these fact rows, in id order: every writer of many rows takes them so, or two
    transactions over the same rows could deadlock."""
    conn.execute(
        "SELECT fact_id FROM memory_facts WHERE fact_id = ANY(%s)"
        " ORDER BY fact_id FOR NO KEY UPDATE",
        (sorted(set(fact_ids)),),
    )


def returned_ids(cur: psycopg.Cursor[Any]) -> set[uuid.UUID]:
    """The ids an `executemany(..., returning=True)` of `RETURNING fact_id` gave back."""
    ids: set[uuid.UUID] = set()
    while True:
        ids.update(row[0] for row in cur.fetchall())
        if not cur.nextset():
            return ids


def write_changes(
    conn: psycopg.Connection[Any], run_id: uuid.UUID, changes: Sequence[FactChange]
) -> None:
    """Upsert every changed fact and the history row of each change actually written.

    New facts first: a contradicted fact points at its successor through a foreign key. A
    pinned row refuses the upsert (`WHERE NOT pinned`), and then no history row may claim a
    change the table never got.
    """
    ordered = sorted(changes, key=lambda c: c.before is not None)
    if not ordered:
        return
    with conn.cursor() as cur:
        # The rows already stored are locked first, in id order, as the indexer's marks lock
        # them: the upserts' own order (new facts first) would let two transactions over the
        # same rows deadlock, and an aborted run pays for its model call again. In a
        # pipeline, nothing waits for the answer.
        lock_in_id_order(conn, [c.after.fact_id for c in ordered])
        cur.executemany(
            _UPSERT + " RETURNING fact_id",
            [_params(c.after, run_id) for c in ordered],
            returning=True,
        )
        written = returned_ids(cur)
        if len(written) < len(ordered):
            _refuse_other_memories(
                cur, [c.after for c in ordered if c.after.fact_id not in written]
            )
        cur.executemany(
            "INSERT INTO fact_history (fact_id, run_id, operation, before, after)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (fact_id, run_id, operation) DO NOTHING",
            [
                (
                    c.after.fact_id,
                    run_id,
                    c.kind.value,
                    None if c.before is None else Jsonb(fact_to_json(c.before)),
                    Jsonb(fact_to_json(c.after)),
                )
                for c in ordered
                if c.after.fact_id in written
            ],
        )


def _refuse_other_memories(cur: psycopg.Cursor[Any], refused: Sequence[Fact]) -> None:
    """An upsert the table refused is a pinned row, or a row of another memory under the same
    id (only possible for ids derived before they carried the organization). The first is
    policy; the second would silently lose this memory's fact, so it fails the run."""
    cur.execute(
        "SELECT fact_id, organization_id, user_id FROM memory_facts WHERE fact_id = ANY(%s)",
        ([f.fact_id for f in refused],),
    )
    owners = {row[0]: (row[1], row[2]) for row in cur.fetchall()}
    clashes = [
        f.fact_id
        for f in refused
        if owners.get(f.fact_id, (f.organization_id, f.user_id)) != (f.organization_id, f.user_id)
    ]
    if clashes:
        raise StoreError(f"fact id(s) {clashes[:3]} belong to another memory")
