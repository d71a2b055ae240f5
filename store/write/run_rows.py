"""The rows a consolidation run writes besides its memory: the run record, connections' learned
info and the credit ledger. Shared by the memory store (inside `apply` and `record_run`) and
the read path's ledger writer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from domain.model import MAX_LEARNED_INFO, LedgerEntry, MemoryState, MemoryUpdate, RunRecord


def insert_run(conn: psycopg.Connection[Any], run: RunRecord) -> None:
    conn.execute(
        "INSERT INTO consolidation_runs (run_id, user_id, organization_id, input_event_ids,"
        " backend, model, prompt_version, status, attempt, base_version, output,"
        " raw_response, gate, prompt_tokens, completion_tokens, cost_micro_usd, duration_ms,"
        " started_at, error)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
        " ON CONFLICT (run_id) DO NOTHING",
        (
            run.run_id,
            run.user_id,
            run.organization_id,
            list(run.input_event_ids),
            run.backend,
            run.model,
            run.prompt_version,
            run.status.value,
            run.attempt,
            run.base_version,
            None if run.output is None else Jsonb(dict(run.output)),
            _text(run.raw_response),
            Jsonb(asdict(run.gate)),
            run.usage.prompt_tokens,
            run.usage.completion_tokens,
            run.cost_micro_usd,
            run.duration_ms,
            run.started_at,
            _text(run.error),
        ),
    )


def append_connections(
    conn: psycopg.Connection[Any], state: MemoryState, update: MemoryUpdate
) -> None:
    for connection_id, additions in update.connection_additions.items():
        conn.execute(
            "INSERT INTO connections"
            " (user_id, connection_id, organization_id, persistent_learned_info)"
            " VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (organization_id, user_id, connection_id) DO UPDATE SET"
            # The latest lines, in their order: what it had, then the additions.
            " persistent_learned_info = (SELECT coalesce(jsonb_agg(line ORDER BY n), '[]')"
            " FROM (SELECT line, n FROM jsonb_array_elements(connections.persistent_learned_info"
            " || EXCLUDED.persistent_learned_info) WITH ORDINALITY AS lines (line, n)"
            " ORDER BY n DESC LIMIT %s) AS kept), updated_at = now()",
            (
                state.user_id,
                connection_id,
                state.organization_id,
                Jsonb(list(additions[-MAX_LEARNED_INFO:])),
                MAX_LEARNED_INFO,
            ),
        )


def insert_ledger(conn: psycopg.Connection[Any], entries: Sequence[LedgerEntry]) -> None:
    """Book entries to the credit ledger; idempotent on their entry ids."""
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO credit_ledger (entry_id, user_id, organization_id, run_id, operation,"
            " model, units, cost_micro_usd, occurred_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (entry_id) DO NOTHING",
            [
                (
                    e.entry_id,
                    e.user_id,
                    e.organization_id,
                    e.run_id,
                    e.operation,
                    e.model,
                    e.units,
                    e.cost_micro_usd,
                    e.occurred_at,
                )
                for e in entries
            ],
        )


def _text(value: str | None) -> str | None:
    """Postgres text cannot hold NUL. A model's raw answer can; a failed run that cannot be
    recorded would hold its batch back, so the NUL is kept visibly escaped instead."""
    return None if value is None else value.replace("\x00", "\\u0000")
