"""Deterministic identities: the same fact, run or ledger entry always gets the same id.

This is what makes every write idempotent: a redelivered event or a replayed batch derives the
ids it had the first time, and `ON CONFLICT DO NOTHING` does the rest.
"""

from __future__ import annotations

import uuid

FACT_NAMESPACE = uuid.UUID("2b0c8a8e-5b1e-4a8f-9a6e-8a3f4f0b9d21")
RUN_NAMESPACE = uuid.UUID("0f5e7c1a-2d4b-4c8e-9e1f-6a7b8c9d0e1f")
LEDGER_NAMESPACE = uuid.UUID("9c1d2e3f-4a5b-4c6d-8e7f-0a1b2c3d4e5f")
MAINTENANCE_NAMESPACE = uuid.UUID("5e0b3c2a-7d1f-4e6a-9b8c-1f2e3d4c5b6a")

# Chroma metadata cannot hold null: "no connection" is stored as this sentinel.
NO_CONNECTION = "__none__"


def normalize_content(content: str) -> str:
    """The form used for identity: case and whitespace do not make a new fact."""
    return " ".join(content.split()).casefold()


def fact_id_for(user_id: str, content: str, connection_id: str | None) -> uuid.UUID:
    """UUID5 of (user, content, scope): the same fact observed twice has one id."""
    scope = connection_id or NO_CONNECTION
    return uuid.uuid5(FACT_NAMESPACE, f"{user_id}\x1f{scope}\x1f{normalize_content(content)}")


def run_id_for(user_id: str, event_ids: frozenset[uuid.UUID], attempt: int = 0) -> uuid.UUID:
    """A run is identified by the events it consolidates, so a replayed batch is the same run."""
    joined = ",".join(sorted(str(e) for e in event_ids))
    return uuid.uuid5(RUN_NAMESPACE, f"{user_id}\x1f{attempt}\x1f{joined}")


def ledger_entry_id_for(run_id: uuid.UUID, operation: str, detail: str = "") -> uuid.UUID:
    return uuid.uuid5(LEDGER_NAMESPACE, f"{run_id}\x1f{operation}\x1f{detail}")


def maintenance_run_id_for(
    job: str, organization_id: str, user_id: str, base_version: int
) -> uuid.UUID:
    """A maintenance run changes one memory at one version: retried, it is the same run."""
    return uuid.uuid5(
        MAINTENANCE_NAMESPACE, f"{job}\x1f{organization_id}\x1f{user_id}\x1f{base_version}"
    )


def read_entry_id_for(log_id: uuid.UUID, operation: str) -> uuid.UUID:
    """The ledger entry of one read (query embedding, query rewrite), keyed by its audit row."""
    return uuid.uuid5(LEDGER_NAMESPACE, f"read\x1f{log_id}\x1f{operation}")
