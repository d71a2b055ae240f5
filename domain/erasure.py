"""The receipt of an erasure: what was removed where, with counts and a digest.

A receipt holds no content and no ids of the memory it erased: the memory is named by its
keyed digest (`domain.ids.subject_digest`). Its digest is a sha256 over the canonical JSON of
everything else, so two receipts of one erasure (the first run, and a run resumed after a
crash) are equal exactly when their digests are.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

# What an erasure writes in place of the text it erases, wherever the code redacts (the SQL
# erase functions, migrations 0004 on, spell it too); the eraser finds the facts a fact
# erasure redacted by it.
REDACTION = "[erased]"
# The same, for a content that holds JSON (a scaffold update's): the marker as a JSON string.
REDACTED_JSON = json.dumps(REDACTION)


class ErasureScope(StrEnum):
    MEMORY = "memory"  # a whole memory: `memoryd forget`, DELETE /v1/users/{user_id}
    FACT = "fact"  # one fact's content


class ErasureStatus(StrEnum):
    STARTED = "started"  # audited, nothing removed yet
    TOMBSTONED = "tombstoned"  # the tombstone is on Kafka and its cut-offs in Postgres
    POSTGRES_ERASED = "postgres_erased"  # Postgres is done (one transaction), counts recorded
    COMPLETED = "completed"  # the vector index too, and the receipt is sealed


@dataclass(frozen=True)
class TombstoneAt:
    topic: str
    partition: int
    offset: int


@dataclass(frozen=True)
class ErasureReceipt:
    erasure_id: uuid.UUID
    scope: ErasureScope
    subject: str
    tombstone: TombstoneAt | None
    removed: Mapping[str, Any]
    digest: str

    def to_json(self) -> dict[str, Any]:
        body = receipt_body(self.erasure_id, self.scope, self.subject, self.tombstone, self.removed)
        return {**body, "digest": self.digest}


@dataclass(frozen=True)
class ErasureAccepted:
    """An erasure audited and not completed, left for the processors to finish: its memory's
    lock was not had within the API's wait. Asked again with the same request id, the request
    answers it (without one, it joins the open erasure of its target)."""

    erasure_id: uuid.UUID
    scope: ErasureScope
    subject: str


ErasureOutcome = ErasureReceipt | ErasureAccepted


def receipt_body(
    erasure_id: uuid.UUID,
    scope: ErasureScope,
    subject: str,
    tombstone: TombstoneAt | None,
    removed: Mapping[str, Any],
) -> dict[str, Any]:
    return {
        "erasure_id": str(erasure_id),
        "scope": scope.value,
        "subject": subject,
        "tombstone": None
        if tombstone is None
        else {
            "topic": tombstone.topic,
            "partition": tombstone.partition,
            "offset": tombstone.offset,
        },
        "removed": dict(removed),
    }


def seal(
    erasure_id: uuid.UUID,
    scope: ErasureScope,
    subject: str,
    tombstone: TombstoneAt | None,
    removed: Mapping[str, Any],
) -> ErasureReceipt:
    """The receipt with its digest computed over the canonical JSON of its body."""
    body = receipt_body(erasure_id, scope, subject, tombstone, removed)
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    digest = "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
    return ErasureReceipt(erasure_id, scope, subject, tombstone, removed, digest)
