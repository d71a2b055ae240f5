"""Deterministic identities: the same fact, run or ledger entry always gets the same id.

This is what makes every write idempotent: a redelivered event or a replayed batch derives the
ids it had the first time, and `ON CONFLICT DO NOTHING` does the rest.

The identity of a memory is the pair (organization, user): customers choose their user ids,
and two organizations' "alice" are two memories. Every id below that belongs to a memory is
derived from both halves, so equal user ids and equal fact texts never meet across tenants.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

FACT_NAMESPACE = uuid.UUID("2b0c8a8e-5b1e-4a8f-9a6e-8a3f4f0b9d21")
RUN_NAMESPACE = uuid.UUID("0f5e7c1a-2d4b-4c8e-9e1f-6a7b8c9d0e1f")
LEDGER_NAMESPACE = uuid.UUID("9c1d2e3f-4a5b-4c6d-8e7f-0a1b2c3d4e5f")
MAINTENANCE_NAMESPACE = uuid.UUID("5e0b3c2a-7d1f-4e6a-9b8c-1f2e3d4c5b6a")
ERASURE_NAMESPACE = uuid.UUID("5e2a7c41-0d3b-4f6e-a819-2c7b4d6e8f03")
TURN_NAMESPACE = uuid.UUID("3d6f0a4e-9b2c-4f7a-8e1d-5c4b3a291807")

# Chroma metadata cannot hold null: "no connection" is stored as this sentinel.
NO_CONNECTION = "__none__"

# The separator of the two halves of a key. Identifiers never contain it (the event contract
# allows [A-Za-z0-9_.:@-] only), so ("a", "b\x1fc") and ("a\x1fb", "c") cannot collide.
KEY_SEPARATOR = "\x1f"


@dataclass(frozen=True, order=True)
class MemoryKey:
    """Whose memory: an organization's user. Every key, lock, cache and filter carries both."""

    organization_id: str
    user_id: str

    def __post_init__(self) -> None:
        if not self.organization_id or not self.user_id:
            raise ValueError(f"a memory needs an organization and a user, got {self!r}")

    def __str__(self) -> str:
        return f"{self.organization_id}/{self.user_id}"

    @property
    def joined(self) -> str:
        return f"{self.organization_id}{KEY_SEPARATOR}{self.user_id}"


class OfMemory:
    """Mixin of the records of one memory: their `key` from their organization and user."""

    organization_id: str
    user_id: str

    @property
    def key(self) -> MemoryKey:
        return MemoryKey(self.organization_id, self.user_id)


def normalize_content(content: str) -> str:
    """The form used for identity: case and whitespace do not make a new fact.

    A fact erasure finds the fact's other wordings by the same rule: the erase functions fold
    case with a copy of `str.casefold` (migration 0021's `case_folds`, which a test checks
    against this one), so no wording of the same id keeps the erased text.
    """
    return " ".join(content.split()).casefold()


def fact_id_for(key: MemoryKey, content: str, connection_id: str | None) -> uuid.UUID:
    """UUID5 of (organization, user, content, scope): the same fact observed twice has one id."""
    scope = connection_id or NO_CONNECTION
    return uuid.uuid5(
        FACT_NAMESPACE,
        f"{key.joined}{KEY_SEPARATOR}{scope}{KEY_SEPARATOR}{normalize_content(content)}",
    )


def run_id_for(key: MemoryKey, event_ids: frozenset[uuid.UUID], attempt: int = 0) -> uuid.UUID:
    """A run is identified by the memory and the events it consolidates, so a replayed batch
    is the same run."""
    joined = ",".join(sorted(str(e) for e in event_ids))
    return uuid.uuid5(RUN_NAMESPACE, f"{key.joined}{KEY_SEPARATOR}{attempt}{KEY_SEPARATOR}{joined}")


def occurrence_run_id() -> uuid.UUID:
    """The id of a failed or discarded run: one occurrence, not a function of its events.

    The same events can fail again after a redrive, or succeed; each occurrence needs its own
    record. An id derived from the events would collide with the succeeded run's id
    (`run_id_for`), and `ON CONFLICT DO NOTHING` would then silently drop that run's record.
    """
    return uuid.uuid4()


def deferred_run_id_for(key: MemoryKey, records: Iterable[tuple[str, int, int]]) -> uuid.UUID:
    """A deferred run (no call was made) is one reading of its Kafka records (topic,
    partition, offset): read again after a crash before their offsets were committed, they
    are the same run; redriven from the dead-letter topic, they are new records and a new run."""
    joined = json.dumps(sorted(records), separators=(",", ":"))
    return uuid.uuid5(RUN_NAMESPACE, f"deferred{KEY_SEPARATOR}{key.joined}{KEY_SEPARATOR}{joined}")


def ledger_entry_id_for(run_id: uuid.UUID, operation: str, detail: str = "") -> uuid.UUID:
    return uuid.uuid5(LEDGER_NAMESPACE, f"{run_id}\x1f{operation}\x1f{detail}")


def maintenance_run_id_for(
    job: str, organization_id: str, user_id: str, base_version: int
) -> uuid.UUID:
    """A maintenance run changes one memory at one version: retried, it is the same run."""
    return uuid.uuid5(
        MAINTENANCE_NAMESPACE, f"{job}\x1f{organization_id}\x1f{user_id}\x1f{base_version}"
    )


@dataclass(frozen=True)
class TurnRequest:
    """What a chat turn asks for, as far as it decides the turn's answer."""

    query: str
    connection_ids: Iterable[str]
    budget: str
    context_types: Iterable[str]

    def digest(self) -> str:
        # Sets, not lists: the same connections in another order are the same request.
        canonical = [
            self.query,
            sorted(set(self.connection_ids)),
            self.budget,
            sorted(set(self.context_types)),
        ]
        encoded = json.dumps(canonical, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(encoded.encode()).hexdigest()


def turn_log_id_for(key: MemoryKey, turn_id: str, request: TurnRequest) -> uuid.UUID:
    """The audit row of a chat turn the caller named: asked again, the same row and charges.
    The memory is part of it: turn ids are the caller's (a conversation's counter, say), and
    two users' first turns must not be one turn. So is the request: a turn id sent again with
    another query is another turn, with its own audit row and charges, not a retry whose
    row and charges would be dropped as already written."""
    return uuid.uuid5(
        TURN_NAMESPACE, f"{key.joined}{KEY_SEPARATOR}{turn_id}{KEY_SEPARATOR}{request.digest()}"
    )


def read_entry_id_for(log_id: uuid.UUID, operation: str) -> uuid.UUID:
    """The ledger entry of one read (query embedding, query rewrite), keyed by its audit row."""
    return uuid.uuid5(LEDGER_NAMESPACE, f"read\x1f{log_id}\x1f{operation}")


def subject_digest(secret: bytes, key: MemoryKey) -> str:
    """A keyed hash of a memory's identity, for the records that must outlive its erasure.

    The erasure audit and the replay cut-offs find an erased memory again by this digest, never
    by its ids: without the secret, a digest cannot be matched against guessed user ids.
    """
    if not secret:
        raise ValueError("the subject digest needs a non-empty secret")
    return hmac.new(secret, key.joined.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class SubjectHasher:
    """`subject_digest` with the deployment's secret, handed to whatever must find an erased
    memory again (the erasure audit, the replay cut-offs)."""

    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if not self.secret:
            raise ValueError("the subject digest needs a non-empty secret")

    def __call__(self, key: MemoryKey) -> str:
        return subject_digest(self.secret, key)

    def fact(self, key: MemoryKey, fact_id: uuid.UUID) -> str:
        """A keyed hash of one of the memory's facts: how the erasure audit finds the erasure
        that removed a fact (its rows keep no ids). Of the memory too, so another memory's
        fact of the same id (ids before 0004 were of the user alone) is another digest."""
        joined = f"{key.joined}{KEY_SEPARATOR}fact{KEY_SEPARATOR}{fact_id}"
        return hmac.new(self.secret, joined.encode(), hashlib.sha256).hexdigest()


def erasure_id_for(subject: str, request_id: str) -> uuid.UUID:
    """The id of an erasure asked for with the caller's own request id: asking again with it
    finds the same erasure (and its receipt) instead of starting another."""
    return uuid.uuid5(ERASURE_NAMESPACE, f"{subject}{KEY_SEPARATOR}{request_id}")
