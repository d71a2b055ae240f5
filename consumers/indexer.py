"""Keeping Chroma in step with `memory_facts`, which stays the system of record.

A fact version is written to the index, then marked `indexed_at` in Postgres with its
embedding cost booked in the same transaction. Chroma upserts are idempotent on the fact id,
so a crash between the two only repeats the upsert. Only the indexer that flips a version from
pending to indexed books it (the ledger entry id is derived from the versions it flipped), so
the flush path and the scheduled drain racing over the same facts book each version once:
the ledger's embedding units are the fact versions indexed.

`IndexQueue` takes indexing off the flush path. A flush is done once its run is committed:
its facts are durable with indexed_at NULL (the outbox), so neither its offsets nor other
users' flushes wait for Chroma. One thread per processor writes what the finished runs
changed, coalesced: Chroma takes one upsert of many facts far better than many concurrent
small ones (measured by bench.processor). A failure leaves the facts pending for the drain.
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import groupby

from consumers.errors import ConsumerError
from consumers.foreground import ForegroundWork
from consumers.observers import IndexObserver
from domain.model import Fact, LedgerEntry, MemoryUpdate
from domain.ports import Clock, IndexOutbox, VectorIndex
from processors.cost import PriceTable, embedding_entry
from store.errors import StoreError, VectorIndexUnavailable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FactIndexer:
    store: IndexOutbox
    index: VectorIndex
    prices: PriceTable
    embedding_model: str
    observer: IndexObserver
    clock: Clock

    def index_changes(self, update: MemoryUpdate) -> int:
        """Index what one run changed; reads the rows back so the versions are the stored ones."""
        return self.index_ids([c.after.fact_id for c in update.fact_changes])

    def index_ids(self, fact_ids: Sequence[uuid.UUID]) -> int:
        """Index these facts' current versions if they are still pending."""
        facts = self.store.facts_by_id(list(dict.fromkeys(fact_ids)))
        return self._index_facts([f for f in facts if f.indexed_at is None])

    def drain_pending(self, batch: int = 256, *, skip_out_of_credit: bool = False) -> int:
        """Index every pending fact (the outbox); returns how many were indexed.

        `skip_out_of_credit` leaves the facts of users whose credit is spent pending (the
        SKIP_EMBEDDINGS budget policy); they are indexed by the first drain after a top-up.
        """
        total = 0
        try:
            while True:
                facts = self.store.pending_index(limit=batch, skip_out_of_credit=skip_out_of_credit)
                if not facts:
                    break
                try:
                    done = self._index_facts(facts)
                except StoreError:
                    # Counted as the flush path's writes are: while only the scheduled drain
                    # writes (no flush), its failures are all MemorydIndexWritesFailing sees.
                    self.observer.index_failed(len(facts))
                    raise
                total += done
                if done == 0:
                    break  # another indexer got them first, or only stale versions were read
        except VectorIndexUnavailable:
            # The backlog an outage grows is what the pending gauge is for.
            self.publish_pending(skip_out_of_credit=skip_out_of_credit)
            raise
        self.publish_pending(skip_out_of_credit=skip_out_of_credit)
        return total

    def publish_pending(self, *, skip_out_of_credit: bool = False) -> None:
        """Set the pending gauges from Postgres (of the whole cluster): how many facts, and
        how long ago the oldest of them changed (0 when none is pending).

        Facts the budget policy holds back for users out of credit are left out: the gauges'
        alerts read a backlog as Chroma down or no drain running, and those facts wait for a
        top-up, which the out-of-credit metrics report."""
        backlog = self.store.pending_backlog(skip_out_of_credit=skip_out_of_credit)
        since = backlog.oldest
        oldest_s = 0.0 if since is None else max(0.0, (self.clock() - since).total_seconds())
        self.observer.pending(backlog.count, oldest_s)

    def _index_facts(self, facts: Sequence[Fact]) -> int:
        if not facts:
            return 0
        embedded = self.index.upsert(facts)
        now = self.clock()
        booked: list[LedgerEntry] = []

        def ledger_for(marked: Sequence[Fact]) -> list[LedgerEntry]:
            booked[:] = self._entries(marked, now)
            return booked

        marked = self.store.mark_indexed(facts, now, ledger_for)
        if len(marked) < len(facts):
            done = {f.fact_id for f in marked}
            unmarked = [f for f in facts if f.fact_id not in done]
            embedded += self._rewrite_overtaken(unmarked)
            self._drop_erased(unmarked)
        self.observer.indexed(embedded, sum(e.cost_micro_usd for e in booked))
        return len(marked)

    def _rewrite_overtaken(self, facts: Sequence[Fact]) -> int:
        """Put back the current versions of facts this indexer may have written over.

        A version read before a newer one was written can reach the index after the newer
        one did, and the newer one's mark (made or to come) would then vouch for the older
        text. The store hands back the rows not indexed at the version written here, locked
        so that no new version and no mark comes between, and they are written again.
        """
        embedded = 0

        def write(current: Sequence[Fact]) -> None:
            nonlocal embedded
            embedded = self.index.upsert(current)

        rewritten = self.store.rewrite_overtaken(facts, write)
        if rewritten:
            log.info("wrote %d overtaken fact version(s) again", len(rewritten))
        return embedded

    def _drop_erased(self, facts: Sequence[Fact]) -> None:
        """Take back the vectors of facts erased while they were being indexed.

        An erasure deletes a memory's vectors after its rows; facts this indexer read before
        the rows went and upserted after the vectors went would outlive it in the index.
        """
        gone = self.store.missing_facts([f.fact_id for f in facts])
        if gone:
            self.index.delete(gone)
            log.info("removed %d vector(s) of facts erased while indexing", len(gone))

    def _entries(self, facts: Sequence[Fact], at: datetime) -> list[LedgerEntry]:
        """One entry per (memory, run that created the facts); its id is derived from the
        exact fact versions, so the same versions can never be booked twice. Their text too:
        a fact an erasure redacts keeps its version and time, and is embedded again."""
        entries = []
        for (_org, _user, run_id), group in groupby(sorted(facts, key=_group_key), key=_group_key):
            members = list(group)
            batch = ",".join(
                f"{f.fact_id}:{f.version}:{f.updated_at.isoformat()}:{f.content}" for f in members
            )
            entries.append(
                embedding_entry(
                    self.prices,
                    run_id=uuid.UUID(run_id),
                    batch_key=batch,
                    key=members[0].key,
                    model=self.embedding_model,
                    texts=len(members),
                    at=at,
                )
            )
        return entries


def _group_key(fact: Fact) -> tuple[str, str, str]:
    return (fact.organization_id, fact.user_id, str(fact.created_by_run))


# How long a write may wait for the processor's flushes to leave the cores (`ForegroundWork`).
YIELD_S = 0.1


class IndexQueue:
    """What committed runs changed, indexed in one background thread, coalesced.

    Before a write the thread waits, up to `yield_s`, until no flush of `foreground` is at
    work and one waits on its backend: at one consolidation at a time the write then runs
    during the next flush's backend call instead of slowing its candidate search
    (BENCHMARKS.md, Processor overhead).
    """

    def __init__(
        self,
        indexer: FactIndexer,
        observer: IndexObserver,
        max_facts: int = 256,
        *,
        foreground: ForegroundWork | None = None,
        yield_s: float = YIELD_S,
    ) -> None:
        if yield_s < 0:
            raise ValueError(f"yield_s must be >= 0, got {yield_s}")
        self._indexer = indexer
        self._observer = observer
        self._max_facts = max_facts
        self.foreground = foreground or ForegroundWork()
        self._yield_s = yield_s
        self._closing = threading.Event()  # a write queued then waits for no flush
        self._queue: queue.SimpleQueue[list[uuid.UUID] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._died: BaseException | None = None

    def submit(self, update: MemoryUpdate) -> None:
        ids = [c.after.fact_id for c in update.fact_changes]
        if not ids:
            return
        with self._lock:
            if self._died is not None:
                # A bug, not an outage: fail the flush loudly rather than queue forever.
                raise ConsumerError(f"the index thread died: {self._died!r}") from self._died
            if self._thread is None:
                self._closing.clear()
                self._thread = threading.Thread(target=self._run, name="indexer", daemon=True)
                self._thread.start()
        self._queue.put(ids)

    def close(self, timeout_s: float = 60.0) -> None:
        """Index what is queued, then stop the thread (a later submit starts a new one)."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._closing.set()
            self.foreground.wake()
            self._queue.put(None)
            thread.join(timeout_s)

    def _run(self) -> None:
        try:
            stop = False
            while not stop:
                first = self._queue.get()
                if first is None:
                    return
                if self._yield_s > 0:
                    released = self.foreground.wait_for_quiet(self._yield_s, self._closing)
                    self._observer.index_write_held(released)
                ids = list(first)
                while len(ids) < self._max_facts:
                    try:
                        more = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if more is None:
                        stop = True
                        break
                    ids += more
                self._index(ids)
        except BaseException as e:
            self._died = e
            raise

    def _index(self, ids: list[uuid.UUID]) -> None:
        try:
            self._indexer.index_ids(ids)
        except StoreError as e:
            # Chroma, the embedder or Postgres failing leaves the facts with indexed_at NULL;
            # the scheduled drain indexes them. Nothing is lost, so the queue goes on.
            self._observer.index_failed(len(ids))
            log.warning("indexing failed, %d fact(s) left pending: %s", len(ids), e)
        except Exception:
            # A bug, with the same outcome: the facts stay pending (counted, and in the pending
            # gauge an alert watches). A thread that died on it failed every later flush after
            # its commit, and the flush's consolidated events were dead-lettered too.
            self._observer.index_failed(len(ids))
            log.exception("indexing failed unexpectedly, %d fact(s) left pending", len(ids))
