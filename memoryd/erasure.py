"""Forgetting: a whole memory (`memoryd forget`, DELETE /v1/users/{id}) or one fact's content.

A memory is forgotten in durable steps, each recorded in the erasure audit before the next
starts, each under the memory's lock (no flush of it runs meanwhile; only the API's audit of
an erasure it could not wait for is written without it, see below):

1. audit: a row of `erasure_audit` (no content, no ids: a keyed digest names the memory);
2. tombstone: a `MemoryTombstone` on the event topic under the memory's key, and per
   partition the first offset that is not forgotten (`memory_cutoffs`): every consumer, also
   a new group reading from offset 0, ignores the memory's events before them;
3. Postgres: every row of the memory in every table, in one transaction (`erase_memory`),
   which records what it removed;
4. Chroma: every vector of the memory, then a count that must be zero;
5. seal: the receipt's digest, and the memory's ids leave `erasure_pending`.

Run again after a crash, it resumes at the first step not recorded, and the receipt comes
out the same (the counts were recorded by the step that removed the rows). Asked again once
completed, it starts a new erasure, which finds nothing but what came since; with the same
`request_id` it returns the first receipt instead. Asked while another erasure of the memory
runs, it waits for it and answers its receipt (through the API, for a bounded time).

The API waits for the lock a bounded time (`forget_or_accept`; a flush holds it through its
model calls): one that did not get it is audited all the same and left open (`ErasureAccepted`)
for the processors' resumption (`resume_pending`) to finish.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime

from consumers.errors import ConsumerError
from domain.erasure import (
    REDACTION,
    ErasureAccepted,
    ErasureOutcome,
    ErasureReceipt,
    ErasureScope,
    ErasureStatus,
    TombstoneAt,
)
from domain.ids import MemoryKey, SubjectHasher, erasure_id_for
from domain.model import FactStatus
from domain.ports import HeldLock, VectorIndex
from memoryd.erasure_errors import ErasureIncomplete, UnknownFact
from producers.contract import MemoryTombstone
from producers.errors import PublishError
from producers.publisher import TombstonePosition
from store.errors import DatabaseUnavailable, MemoryBusy, StoreError, VectorIndexUnavailable
from store.write.erasure_log import ErasureRecord, PostgresErasureLog
from store.write.memory_store import PostgresMemoryStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ErasureRequest:
    actor: str
    reason: str
    request_id: str | None = None  # the caller's idempotency key: same key, same erasure


@dataclass(frozen=True)
class Eraser:
    erasures: PostgresErasureLog
    memory: PostgresMemoryStore
    index: VectorIndex
    publish_tombstone: Callable[[MemoryTombstone], TombstonePosition]
    end_offsets: Callable[[], Mapping[int, int]]
    subjects: SubjectHasher
    clock: Callable[[], datetime]
    on_erased: Callable[[MemoryKey], None] = lambda _key: None
    # How long `forget_or_accept` and `erase_fact_or_accept` (the API) wait for the memory's
    # lock, which a flush holds through its model calls; `forget` and `erase_fact` (the CLI)
    # wait as long as it takes.
    lock_wait_s: float | None = None

    # -- a whole memory -------------------------------------------------------------------

    def forget(self, key: MemoryKey, request: ErasureRequest) -> ErasureReceipt:
        """Erase the memory everywhere and return the receipt (resuming an open erasure).

        Without a request id, an erasure of the memory that was open when this request came,
        or was audited since, is this request's too: concurrent forgets share one receipt.
        """
        seen = self.erasures.latest(self.subjects(key), ErasureScope.MEMORY)
        with self.memory.memory_lock(key) as held:
            return self._steps(key, None, self._audit_forget(key, request, seen), held)

    def forget_or_accept(self, key: MemoryKey, request: ErasureRequest) -> ErasureOutcome:
        """`forget`, or the erasure accepted if the memory's lock is not had in `lock_wait_s`."""
        seen = self.erasures.latest(self.subjects(key), ErasureScope.MEMORY)
        return self._within(key, None, lambda: self._audit_forget(key, request, seen))

    def _audit_forget(
        self, key: MemoryKey, request: ErasureRequest, seen: ErasureRecord | None
    ) -> ErasureRecord:
        erasure_id = self._earlier(key, ErasureScope.MEMORY, None, request)
        return self._open(
            key, ErasureScope.MEMORY, None, request, erasure_id or self._since(key, seen, request)
        )

    def _within(
        self, key: MemoryKey, fact_id: uuid.UUID | None, audit: Callable[[], ErasureRecord]
    ) -> ErasureOutcome:
        """The audited erasure's steps under the memory's lock if it is had in `lock_wait_s`;
        otherwise the erasure audited and left open, which the caller need not wait for."""
        with ExitStack() as stack:
            try:
                held = stack.enter_context(self.memory.memory_lock(key, self.lock_wait_s))
            except MemoryBusy:
                # Audited without the lock: the flush that holds it writes its run, and the
                # erasure, taken up under the lock later, removes that too.
                record = audit()
                if record.status is ErasureStatus.COMPLETED:  # finished while this one waited
                    return record.receipt()
                log.info("erasure %s: accepted, its memory is busy", record.erasure_id)
                return ErasureAccepted(record.erasure_id, record.scope, record.subject)
            return self._steps(key, fact_id, audit(), held)

    def _since(
        self, key: MemoryKey, seen: ErasureRecord | None, request: ErasureRequest
    ) -> uuid.UUID | None:
        """The memory's erasure that completed while this request waited for the lock: one
        open when it first looked, or one audited after that (its tombstone came later)."""
        if request.request_id is not None:  # a request id names an erasure of its own
            return None
        latest = self.erasures.latest(self.subjects(key), ErasureScope.MEMORY)
        if latest is None:
            return None
        if seen is not None and seen.erasure_id == latest.erasure_id:
            # Completed before this request came: a new erasure, for what came since.
            return None if seen.status is ErasureStatus.COMPLETED else latest.erasure_id
        return latest.erasure_id

    def _steps(
        self, key: MemoryKey, fact_id: uuid.UUID | None, record: ErasureRecord, held: HeldLock
    ) -> ErasureReceipt:
        """The steps left of an audited erasure; the memory's lock is `held`, checked before
        each step that acts by key alone (its session may have ended, and another taken it)."""
        if record.status is not ErasureStatus.COMPLETED:
            if fact_id is None:
                record = self._forget_steps(key, record, held)
            else:
                record = self._erase_fact_steps(key, fact_id, record, held)
        return record.receipt()

    def _resume(
        self,
        key: MemoryKey,
        fact_id: uuid.UUID | None,
        erasure_id: uuid.UUID,
        wait_s: float | None = None,
    ) -> ErasureReceipt:
        with self.memory.memory_lock(key, wait_s) as held:
            # Read under the lock: another process may have moved it on meanwhile.
            record = self.erasures.get(erasure_id)
            if record is None:
                raise StoreError(f"erasure {erasure_id} is not audited")
            return self._steps(key, fact_id, record, held)

    def _forget_steps(self, key: MemoryKey, record: ErasureRecord, held: HeldLock) -> ErasureRecord:
        subject = record.subject
        if record.status is ErasureStatus.STARTED:
            self._tombstone(key, record, held)
            log.info("erasure %s: tombstone recorded", record.erasure_id)
        if record.status in (ErasureStatus.STARTED, ErasureStatus.TOMBSTONED):
            vectors = self.index.count(key)
            held.check()
            self.erasures.erase_memory(
                record.erasure_id, key, subject, {"chroma": {"vectors": vectors}}
            )
            log.info("erasure %s: postgres erased", record.erasure_id)
        held.check()  # the delete is by organization and user: a new memory's vectors too
        self.index.delete_memory(key)
        left = self.index.count(key)
        if left:
            raise ErasureIncomplete(f"erasure {record.erasure_id}: {left} vector(s) left")
        self.on_erased(key)
        return self.erasures.complete(record.erasure_id)

    def _tombstone(self, key: MemoryKey, record: ErasureRecord, held: HeldLock) -> None:
        held.check()
        position = self.publish_tombstone(
            MemoryTombstone(
                organization_id=key.organization_id,
                user_id=key.user_id,
                erasure_id=record.erasure_id,
                forgotten_at=self.clock(),
            )
        )
        # Read after the tombstone is acknowledged: on the other partitions everything up to
        # here is older than the forget (events keyed before the key held the organization).
        try:
            ends = self.end_offsets()
        except ConsumerError as e:  # the erasure stays open; asked again, it tombstones again
            raise PublishError(f"tombstone written, partition ends not read: {e}") from e
        cutoffs = {(position.topic, p): end for p, end in ends.items()}
        cutoffs[(position.topic, position.partition)] = position.offset
        tombstone = TombstoneAt(position.topic, position.partition, position.offset)
        held.check()  # cut-offs moved past a new memory's events would drop them
        self.erasures.record_tombstone(record.erasure_id, record.subject, tombstone, cutoffs)

    # -- one fact -------------------------------------------------------------------------

    def erase_fact(
        self, key: MemoryKey, fact_id: uuid.UUID, request: ErasureRequest
    ) -> ErasureReceipt:
        """Delete one fact and every copy of its text in the memory (not an archive).

        Raises `UnknownFact`, auditing nothing, for a fact id the memory does not hold unless
        an erasure of it is open (a crash left it midway: its row may be gone already), was
        made with this request id (a retry: its receipt is the answer) or removed it (another
        caller's, maybe finished while this one waited for the lock: its receipt is the
        answer, as concurrent forgets of a memory share one). The vector index is keyed by
        fact id alone, so without this check a fact id of another memory, even of the same
        user id in another organization, would lose its vector here.
        """
        seen = self._earlier(key, ErasureScope.FACT, fact_id, request)
        self._held_or_audited(key, fact_id, seen)  # refused before any wait for the lock
        with self.memory.memory_lock(key) as held:
            return self._steps(key, fact_id, self._audit_fact(key, fact_id, request, seen), held)

    def erase_fact_or_accept(
        self, key: MemoryKey, fact_id: uuid.UUID, request: ErasureRequest
    ) -> ErasureOutcome:
        """`erase_fact`, or the erasure accepted if the memory's lock is not had in
        `lock_wait_s`; an unknown fact is refused all the same."""
        seen = self._earlier(key, ErasureScope.FACT, fact_id, request)
        self._held_or_audited(key, fact_id, seen)
        return self._within(key, fact_id, lambda: self._audit_fact(key, fact_id, request, seen))

    def _audit_fact(
        self, key: MemoryKey, fact_id: uuid.UUID, request: ErasureRequest, seen: uuid.UUID | None
    ) -> ErasureRecord:
        # Again after the wait: the erasure seen open may have completed meanwhile (its
        # receipt is the answer), or another may have erased the fact since.
        erasure_id = self._held_or_audited(
            key, fact_id, self._earlier(key, ErasureScope.FACT, fact_id, request) or seen
        )
        return self._open(key, ErasureScope.FACT, fact_id, request, erasure_id)

    def _held_or_audited(
        self, key: MemoryKey, fact_id: uuid.UUID, erasure_id: uuid.UUID | None
    ) -> uuid.UUID | None:
        """The erasure the request goes on with: `erasure_id`, or for a fact the memory no
        longer holds, the last erasure of it; None for a fact the memory holds (a new erasure
        of it). A fact the memory never held (or holds again, learned anew) has none."""
        if erasure_id is not None or self._holds(key, fact_id):
            return erasure_id
        removed_by = self.erasures.of_target(self.subjects(key), self.subjects.fact(key, fact_id))
        if removed_by is None:
            raise UnknownFact(f"{key} has no fact {fact_id}")
        return removed_by.erasure_id

    def _holds(self, key: MemoryKey, fact_id: uuid.UUID) -> bool:
        return any(f.key == key for f in self.memory.facts_by_id([fact_id]))

    def _erase_fact_steps(
        self, key: MemoryKey, fact_id: uuid.UUID, record: ErasureRecord, held: HeldLock
    ) -> ErasureRecord:
        # An erasure opened before `erase_fact` checked the owner may name another memory's
        # fact (resumed by `resume_pending`): Postgres erases nothing of it (the owner is in
        # its WHERE), and its vector, keyed by the fact id alone, must stay too.
        foreign = any(f.key != key for f in self.memory.facts_by_id([fact_id]))
        if record.status is ErasureStatus.STARTED:
            vectors = 0 if foreign else len(self.index.embeddings([fact_id]))
            held.check()  # else a flush holding the lock since would write the text back
            self.erasures.erase_fact(
                record.erasure_id, key, fact_id, {"chroma": {"vectors": vectors}}
            )
        if foreign:
            log.warning(
                "erasure %s: the fact is another memory's; nothing erased", record.erasure_id
            )
        else:
            held.check()  # a memory started again may have learned the fact anew, same id
            self.index.delete([fact_id])
            if self.index.embeddings([fact_id]):
                raise ErasureIncomplete(f"erasure {record.erasure_id}: the fact's vector is left")
            self._rewrite_redacted(key)
        self.on_erased(key)
        return self.erasures.complete(record.erasure_id)

    def _rewrite_redacted(self, key: MemoryKey) -> None:
        """Give the index the redacted text of the facts that quoted the erased one.

        Postgres redacts them and leaves them pending; until an indexer got to them, and the
        drain leaves an out-of-credit memory's facts pending, the index held the erased text
        under their ids. They are written under their row locks and left pending, unbooked:
        the indexer marks them as ever, and one that read them before the redaction writes
        them again when its mark misses.
        """
        redacted = [
            f
            for f in self.memory.facts(key, tuple(FactStatus))
            if f.indexed_at is None and REDACTION in f.content
        ]
        self.memory.rewrite_overtaken(redacted, self.index.upsert)

    # -- resuming -------------------------------------------------------------------------

    def resume_pending(
        self, young_since: datetime | None = None, *, keep_going: bool = False
    ) -> list[ErasureReceipt]:
        """Finish the open erasures: a crash's, and those accepted while their memory was busy.

        One requested after `young_since` may still be running in the process that started
        it, which holds the memory's lock from its audit to its end: it is finished only if
        the lock is free now, and left for a later call otherwise, never waited for.
        """
        receipts = []
        for p in self.erasures.pending():
            erasure_id = p.record.erasure_id
            young = young_since is not None and p.record.requested_at > young_since
            try:
                receipts.append(self._resume(p.key, p.fact_id, erasure_id, 0 if young else None))
            except MemoryBusy:
                # Running elsewhere, or its memory is being flushed: still open and audited,
                # so a later call finishes it (or, once old, waits for the lock).
                log.info("erasure %s: its memory is busy, left for later", erasure_id)
            except (DatabaseUnavailable, VectorIndexUnavailable):
                raise  # every erasure would fail alike: the pass ends, the job retries it
            except StoreError as e:
                if not keep_going:  # `forget --resume` says why, and exits non-zero
                    raise
                # This one's step failed (a vector left, its statement refused): open at the
                # step it reached, for the next pass (MemorydErasureStuck sees it); those after
                # it must not wait for it. Kafka away (PublishError) ends the pass, as above.
                log.warning("erasure %s: not finished, retried next time: %s", erasure_id, e)
        return receipts

    def earlier_receipt(
        self, key: MemoryKey, fact_id: uuid.UUID | None, request_id: str
    ) -> ErasureReceipt | None:
        """The receipt of the completed erasure asked for earlier with this request id."""
        scope = ErasureScope.MEMORY if fact_id is None else ErasureScope.FACT
        record = self.erasures.get(self._erasure_id(key, scope, fact_id, request_id))
        if record is None or record.status is not ErasureStatus.COMPLETED:
            return None
        return record.receipt()

    def _erasure_id(
        self, key: MemoryKey, scope: ErasureScope, fact_id: uuid.UUID | None, request_id: str
    ) -> uuid.UUID:
        target = "" if fact_id is None else str(fact_id)
        return erasure_id_for(self.subjects(key), f"{scope.value}:{target}:{request_id}")

    def _earlier(
        self,
        key: MemoryKey,
        scope: ErasureScope,
        fact_id: uuid.UUID | None,
        request: ErasureRequest,
    ) -> uuid.UUID | None:
        """The audited erasure this request goes on with: the one made with its request id,
        or without one, the erasure of the same target open (a crash left it, or a flush held
        its memory when it was asked for)."""
        if request.request_id is not None:
            erasure_id = self._erasure_id(key, scope, fact_id, request.request_id)
            return erasure_id if self.erasures.get(erasure_id) is not None else None
        running = self.erasures.open_erasure(self.subjects(key), scope, fact_id)
        return None if running is None else running.erasure_id

    def _open(
        self,
        key: MemoryKey,
        scope: ErasureScope,
        fact_id: uuid.UUID | None,
        request: ErasureRequest,
        erasure_id: uuid.UUID | None,
    ) -> ErasureRecord:
        """Audit the erasure `erasure_id`, or a new one: a request id names its erasure;
        without one, the request joins an erasure of its target open by now, else it is its
        own."""
        join_open = erasure_id is None and request.request_id is None
        if erasure_id is None:
            erasure_id = (
                uuid.uuid4()
                if request.request_id is None
                else self._erasure_id(key, scope, fact_id, request.request_id)
            )
        return self.erasures.start(
            erasure_id,
            subject=self.subjects(key),
            scope=scope,
            key=key,
            fact_id=fact_id,
            actor=request.actor,
            reason=request.reason,
            target=None if fact_id is None else self.subjects.fact(key, fact_id),
            join_open=join_open,
        )
