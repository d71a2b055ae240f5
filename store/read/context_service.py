"""The read path of every chat turn: W, S, learned info and the facts relevant to the turn.

Injection (W, S, learned info, connections' info, pinned facts) comes from the per-version
cache: one primary-key lookup when nothing changed. Retrieval fuses a dense and a keyword
search, re-ranks, diversifies and cuts to the budget (`store.read.turn_ranking`). With a
`DenseSearch` both searches and the rows ranked come from the memory's entry at its stamp
(`store.read.dense`); only the facts picked are then read from Postgres, which is the truth
for a fact's status and scope: should one have changed since the entry was read (a run
committing during the turn), the turn ranks again on Postgres's current rows of all its
candidates, so a fact contradicted meanwhile is never shown. Without an entry the keyword
search is Postgres's and every candidate's row is read from it. With Chroma down the bundle
still comes back from the keyword search, marked degraded. The audit row (which carries the
turn's recalls) and the turn's costs are handed to background writers: `assemble` never waits
for them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Protocol

from domain.ids import MemoryKey
from domain.model import Fact, FactStatus, LedgerEntry, TokenUsage
from domain.ports import Clock, ReadModel, Vector, VectorHit, VectorIndex
from domain.reads import ContextLogRow, Injection, MemoryStamp, Scope
from store.errors import VectorIndexUnavailable
from store.read.background import BatchWriter
from store.read.bundle import ContextBundle, RetrievedFact, audit_row
from store.read.dense import DenseSearch
from store.read.injection import InjectionCache
from store.read.query_rewrite import Rewrite, RewriteOutcome, late_usage
from store.read.ranking import PROFILES, Budget, BudgetProfile
from store.read.read_ledger import ReadCharge, ReadCost
from store.read.rendering import render_prompt_block
from store.read.turn_ranking import Candidates, rank


class ReadPathObserver(Protocol):
    """What `assemble` reports; `store.read.read_metrics.ReadPathMetrics` is the Prometheus one."""

    def assembled(
        self, bundle: ContextBundle, cache_hit: bool, rewrite: RewriteOutcome | None
    ) -> None:
        """A bundle went back to the caller; `rewrite` is None when no rewriter is set."""


@dataclass
class _Stopwatch:
    started: float = field(default_factory=time.perf_counter)
    last: float = 0.0
    laps: dict[str, float] = field(default_factory=dict)

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.laps[stage] = (now - (self.last or self.started)) * 1000
        self.last = now

    @property
    def total_ms(self) -> float:
        return (time.perf_counter() - self.started) * 1000


@dataclass(frozen=True)
class _Found:
    facts: list[RetrievedFact]
    candidates: int
    degraded_reason: str | None
    embedded_query: bool = False


class ContextService:
    def __init__(
        self,
        reads: ReadModel,
        index: VectorIndex,
        clock: Clock,
        *,
        cache: InjectionCache | None = None,
        rewriter: Callable[[str], Rewrite] | None = None,
        audit: BatchWriter[ContextLogRow] | None = None,
        observer: ReadPathObserver | None = None,
        charges: Callable[[ReadCharge], Sequence[LedgerEntry]] | None = None,
        ledger: BatchWriter[ReadCost] | None = None,
        dense: DenseSearch | None = None,
    ) -> None:
        self._reads = reads
        self._charges = charges
        self._ledger = ledger
        self._index = index
        self._dense_search = dense
        self._clock = clock
        self._cache = cache or InjectionCache(reads)
        self._rewriter = rewriter
        self._audit = audit
        self._observer = observer

    def assemble(
        self,
        key: MemoryKey,
        query: str,
        active_connection_ids: Sequence[str] = (),
        budget: Budget = Budget.BALANCED,
        *,
        context_types: Sequence[str] = (),
        statuses: Sequence[FactStatus] = (FactStatus.ACTIVE,),
        log_id: uuid.UUID | None = None,
    ) -> ContextBundle:
        """The context for one turn of one memory (an organization's user).

        Every read is scoped to `key`: nothing of another organization's user of the same id
        can come back. `statuses` widens retrieval beyond active facts (an audit view, say);
        pinned facts are always in. `log_id` makes the audit row idempotent when the caller
        retries the same turn. An unknown memory gets an empty, valid bundle.
        """
        watch = _Stopwatch()
        # Before anything of the memory is read: what the turn leaves behind is dropped if an
        # erasure of the memory completed since (`still_the_memory_read`).
        read_at = self._clock()
        injection, hit = self._cache.get(key)
        watch.lap("injection")
        rewrite = self._rewrite(query)
        watch.lap("rewrite")
        connections = tuple(sorted(set(active_connection_ids)))
        scope = Scope(
            key=key,
            connection_ids=connections,
            statuses=tuple(dict.fromkeys(statuses)),
            context_types=tuple(sorted(set(context_types))),
        )
        pinned = [f for f in injection.pinned if _in_scope(f, connections) and f.key == key]
        found = self._retrieve(
            scope, injection.stamp, rewrite.query, PROFILES[budget], pinned, watch
        )
        bundle = ContextBundle(
            organization_id=key.organization_id,
            user_id=key.user_id,
            memory_version=injection.state.version,
            working_memory=injection.state.working_memory,
            scaffold=scoped_scaffold(injection.state.scaffold, connections),
            learned_info=injection.state.learned_info,
            connection_info={
                c: injection.connections[c] for c in connections if c in injection.connections
            },
            facts=tuple(found.facts),
            degraded=found.degraded_reason is not None,
            degraded_reason=found.degraded_reason,
            latency_ms=0.0,
            connection_ids=connections,
            log_id=log_id or uuid.uuid4(),
            budget=budget,
            query=query,
            rewritten_query=rewrite.query if rewrite.outcome is RewriteOutcome.REWRITTEN else None,
        )
        bundle = replace(bundle, prompt_block=render_prompt_block(bundle))
        watch.lap("render")
        bundle = replace(bundle, latency_ms=watch.total_ms, timings_ms=dict(watch.laps))
        self._observe(bundle, hit, rewrite)
        self._hand_off(bundle, injection, found.candidates, read_at)
        self._book(bundle, injection, found.embedded_query, rewrite, read_at)
        return bundle

    def forget(self, key: MemoryKey) -> None:
        """Drop what this process caches of a memory (its erasure calls it)."""
        self._cache.invalidate(key)
        if self._dense_search is not None:
            self._dense_search.forget(key)

    def sweep_cache(self) -> int:
        """Drop cached injections and dense matrices of memories erased or changed elsewhere;
        returns how many entries went."""
        dropped = self._cache.sweep()
        if self._dense_search is not None:
            dropped += self._dense_search.sweep(self._reads.memory_stamps)
        return dropped

    # -- retrieval ------------------------------------------------------------------------

    def _dense(
        self, scope: Scope, stamp: MemoryStamp, text: str, pool: int
    ) -> tuple[list[VectorHit], Mapping[uuid.UUID, Vector]]:
        """Exact search over the user's facts in scope; the vectors come back for MMR.

        With a `DenseSearch` the memory's matrix is cached per stamp (one Chroma fetch per
        consolidation or erasure); without one, the vectors are fetched by id on every call.
        """
        if self._dense_search is not None:
            return self._dense_search.search(scope, stamp, text, pool)
        ids = self._reads.indexed_ids(scope, UNCACHED_SEARCH_MAX_FACTS)
        return self._index.score(text, ids, pool)

    def _keyword(
        self,
        scope: Scope,
        stamp: MemoryStamp,
        text: str,
        pool: int,
        hits: Sequence[VectorHit],
        watch: _Stopwatch,
    ) -> tuple[list[Fact], dict[uuid.UUID, Fact], bool]:
        """The keyword ranking, the rows of it and of the dense hits, and whether those rows
        are the memory entry's (still to be confirmed against Postgres) or Postgres's own.

        From the memory's in-process BM25 index and rows when the dense stage has its entry,
        else from the SQL BM25 and the current rows (Chroma may lag behind a status or scope
        change: only Postgres's rows count).
        """
        dense_ids = [h.fact_id for h in hits]
        if self._dense_search is not None:
            ranked = self._dense_search.keyword(scope, stamp, text, pool)
            if ranked is not None:
                cached = self._dense_search.rows(scope, stamp, [*ranked, *dense_ids])
                if cached is not None:
                    watch.lap("keyword")
                    return [cached[i] for i in ranked if i in cached], cached, True
        keyword = self._reads.keyword_search(scope, text, pool)
        watch.lap("keyword")
        rows = {f.fact_id: f for f in keyword}
        wanted = [i for i in dense_ids if i not in rows]
        rows |= {f.fact_id: f for f in self._reads.facts_in_scope(scope, wanted)}
        watch.lap("truth")
        return keyword, rows, False

    def _retrieve(
        self,
        scope: Scope,
        stamp: MemoryStamp,
        text: str,
        profile: BudgetProfile,
        pinned: Sequence[Fact],
        watch: _Stopwatch,
    ) -> _Found:
        degraded: str | None = None
        try:
            hits, known_vectors = self._dense(scope, stamp, text, profile.pool)
        except VectorIndexUnavailable as e:
            hits, known_vectors, degraded = [], {}, f"vector index unavailable: {e}"
        # Both dense searches embed the query only when something in scope has a vector, and
        # then find it: no hit, no embedding to book (an empty memory, another connection's).
        embedded = bool(hits)
        watch.lap("dense")
        keyword, rows, cached = self._keyword(scope, stamp, text, profile.pool, hits, watch)
        ranked = Candidates(hits, keyword, rows, pinned, degraded, known_vectors)
        picked = rank(ranked, text, profile, self._clock(), self._index.embeddings)
        watch.lap("rank")
        if cached:
            # Ranked on the entry's rows: the picked ones must still be in scope at the same
            # version in Postgres, and are shown with its current recall counters. A run
            # committed since the entry's stamp was read changed one: rank again on the
            # current rows of all.
            current = self._reads.fact_counters(scope, picked.chosen)
            if all(i in current and current[i].version == rows[i].version for i in picked.chosen):
                fresh = {i: current[i].applied_to(rows[i]) for i in picked.chosen}
                ranked = replace(ranked, rows=rows | fresh)
            else:
                wanted = list(dict.fromkeys([*(f.fact_id for f in keyword), *rows]))
                rows = {f.fact_id: f for f in self._reads.facts_in_scope(scope, wanted)}
                keyword = [rows[f.fact_id] for f in keyword if f.fact_id in rows]
                ranked = replace(ranked, keyword=keyword, rows=rows)
                picked = rank(ranked, text, profile, self._clock(), self._index.embeddings)
            watch.lap("truth")
        return _Found(
            ranked.retrieved(picked), picked.candidates, picked.degraded or degraded, embedded
        )

    def _rewrite(self, query: str) -> Rewrite:
        if self._rewriter is None:
            return Rewrite(query, RewriteOutcome.UNCHANGED)
        return self._rewriter(query)

    # -- off the hot path -----------------------------------------------------------------

    def _hand_off(
        self, bundle: ContextBundle, injection: Injection, candidates: int, read_at: datetime
    ) -> None:
        if self._audit is not None:
            self._audit.submit(audit_row(bundle, injection, candidates, self._clock(), read_at))

    def _book(
        self,
        bundle: ContextBundle,
        injection: Injection,
        embedded: bool,
        rewrite: Rewrite,
        read_at: datetime,
    ) -> None:
        """Hand the read's costs (query embedding, query rewrite) to the ledger writer; a
        rewrite call the turn did not wait for is booked when it ends."""
        if self._charges is None or self._ledger is None or bundle.log_id is None:
            return
        charges, ledger = self._charges, self._ledger
        log_id, generation = bundle.log_id, injection.generation
        # A retried turn keeps its log id but calls the rewriter again: a call of its own.
        call = uuid.uuid4()

        def book(embedded: bool, usage: TokenUsage | None) -> None:
            charge = ReadCharge(
                log_id,
                bundle.user_id,
                bundle.organization_id,
                self._clock(),
                embedded,
                usage,
                call,
            )
            for entry in charges(charge):
                ledger.submit(ReadCost(entry, generation, read_at))

        book(embedded, rewrite.usage)
        if rewrite.late is not None:
            rewrite.late.add_done_callback(lambda call: book(False, late_usage(call)))

    def _observe(self, bundle: ContextBundle, hit: bool, rewrite: Rewrite) -> None:
        if self._observer is not None:
            outcome = rewrite.outcome if self._rewriter is not None else None
            self._observer.assembled(bundle, hit, outcome)

    def close(self) -> None:
        """Write what the background writers hold (audit rows with their recalls, costs)."""
        for writer in (self._audit, self._ledger):
            if writer is not None:
                writer.close()


CONNECTIONS_KEY = "Connections"
# Without a DenseSearch every turn fetches the vectors it scores: a bound on that fetch.
UNCACHED_SEARCH_MAX_FACTS = 100_000


def scoped_scaffold(scaffold: Mapping[str, Any], connection_ids: Sequence[str]) -> dict[str, Any]:
    """S as this turn may see it: what was learned inside a connection only when it is active.

    Backends keep connection-scoped knowledge under S["Connections"][connection_id] (the prompt
    asks for it; the offline backend does it), so one filter here covers every backend.
    """
    out = dict(scaffold)
    per_connection = out.get(CONNECTIONS_KEY)
    if isinstance(per_connection, Mapping):
        visible = {k: v for k, v in per_connection.items() if k in connection_ids}
        if visible:
            out[CONNECTIONS_KEY] = visible
        else:
            del out[CONNECTIONS_KEY]
    return out


def _in_scope(fact: Fact, connection_ids: Sequence[str]) -> bool:
    connection = fact.provenance.connection_id
    return connection is None or connection in connection_ids
