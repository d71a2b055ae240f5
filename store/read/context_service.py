"""The read path of every chat turn: W, S, learned info and the facts relevant to the turn.

Injection (W, S, learned info, connections' info, pinned facts) comes from the per-version
cache: one primary-key lookup when nothing changed. Retrieval fuses a dense search in Chroma
and a keyword search in Postgres, re-ranks, diversifies and cuts to the budget (the pure
steps are in `store.read.ranking`). Postgres is the truth for a fact's status and scope, so a fact
contradicted after Chroma last saw it is never shown. With Chroma down the bundle still comes
back from the keyword search, marked degraded. Recall counters and the audit row are handed
to background writers: `assemble` never waits for them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from domain.ids import MemoryKey, normalize_content
from domain.model import Fact, FactStatus, LedgerEntry
from domain.ports import Clock, ReadModel, Vector, VectorHit, VectorIndex
from domain.reads import ContextLogRow, Injection, MemoryStamp, Recall, Scope
from store.errors import VectorIndexUnavailable
from store.read.background import BatchWriter
from store.read.bundle import ContextBundle, RetrievedFact, audit_row
from store.read.dense import DenseSearch
from store.read.injection import InjectionCache
from store.read.query_rewrite import Rewrite, RewriteOutcome
from store.read.ranking import (
    PROFILES,
    Budget,
    BudgetProfile,
    cue_weight,
    mmr,
    query_cues,
    reciprocal_rank_fusion,
    rerank,
    within_budget,
)
from store.read.read_ledger import ReadCharge
from store.read.rendering import render_prompt_block


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
        recalls: BatchWriter[Recall] | None = None,
        observer: ReadPathObserver | None = None,
        charges: Callable[[ReadCharge], Sequence[LedgerEntry]] | None = None,
        ledger: BatchWriter[LedgerEntry] | None = None,
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
        self._recalls = recalls
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
        self._hand_off(bundle, injection, found.candidates)
        self._book(bundle, found.embedded_query, rewrite)
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
    ) -> tuple[list[Fact], dict[uuid.UUID, Fact]]:
        """The keyword ranking, and the current rows of it and of the dense hits.

        From the memory's in-process BM25 index when the dense stage has its entry (then one
        query reads the rows of both rankings), else from the SQL BM25. Chroma and the cached
        index may lag behind a status or scope change: only Postgres's current rows count.
        """
        dense_ids = [h.fact_id for h in hits]
        ranked = None
        if self._dense_search is not None:
            ranked = self._dense_search.keyword(scope, stamp, text, pool)
        if ranked is None:
            keyword = self._reads.keyword_search(scope, text, pool)
            watch.lap("keyword")
            rows = {f.fact_id: f for f in keyword}
            wanted = [i for i in dense_ids if i not in rows]
        else:
            watch.lap("keyword")
            rows, wanted = {}, list(dict.fromkeys([*ranked, *dense_ids]))
        rows |= {f.fact_id: f for f in self._reads.facts_in_scope(scope, wanted)}
        if ranked is not None:
            keyword = [rows[i] for i in ranked if i in rows]
        return keyword, rows

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
        embedded = degraded is None
        watch.lap("dense")
        keyword, rows = self._keyword(scope, stamp, text, profile.pool, hits, watch)
        watch.lap("truth")
        pinned_ids = {f.fact_id for f in pinned}
        similarity = {h.fact_id: h.similarity for h in hits}
        dense_ranking = [
            h.fact_id for h in hits if h.fact_id in rows and h.fact_id not in pinned_ids
        ]
        keyword_ranking = [f.fact_id for f in keyword if f.fact_id not in pinned_ids]
        if degraded:
            fused = reciprocal_rank_fusion([keyword_ranking])
        else:
            # The dense term keeps how near a fact is, not only its rank (see the fusion).
            fused = reciprocal_rank_fusion(
                [dense_ranking, keyword_ranking], strengths=[similarity, None]
            )
        now, cues = self._clock(), query_cues(text)
        scores = {
            fid: rerank(
                fused[fid],
                # When it happened, not when a run last touched it.
                updated_at=rows[fid].observed_at or rows[fid].updated_at,
                salience=rows[fid].salience,
                confidence=rows[fid].confidence,
                now=now,
            )
            * cue_weight(rows[fid], cues)
            for fid in fused
        }
        ordered = _without_repeats(
            sorted(scores.items(), key=lambda kv: (-kv[1], str(kv[0]))), rows, pinned
        )
        wanted = [*pinned_ids, *(k for k, _ in ordered)]
        vectors: dict[uuid.UUID, Vector] = {
            k: known_vectors[k] for k in wanted if k in known_vectors
        }
        missing = [k for k in wanted if k not in vectors]
        if not degraded and missing:
            try:
                vectors |= self._index.embeddings(missing)
            except VectorIndexUnavailable as e:
                degraded = f"vector index unavailable: {e}"
        picked = mmr(
            ordered,
            vectors,
            limit=profile.max_facts,
            lam=profile.mmr_lambda,
            selected=list(pinned_ids),
        )
        sizes = {k: len(rows[k].content) for k in picked}
        chosen = within_budget([(k, scores[k]) for k in picked], profile, sizes)
        dense_rank = {fid: i for i, fid in enumerate(dense_ranking, start=1)}
        keyword_rank = {fid: i for i, fid in enumerate(keyword_ranking, start=1)}
        facts = [RetrievedFact(f, 1.0, 1.0, pinned=True) for f in pinned]
        facts += [
            RetrievedFact(
                rows[fid],
                similarity.get(fid, 0.0),
                scores[fid],
                dense_rank=dense_rank.get(fid),
                keyword_rank=keyword_rank.get(fid),
            )
            for fid in chosen
        ]
        watch.lap("rank")
        return _Found(facts, len(fused), degraded, embedded)

    def _rewrite(self, query: str) -> Rewrite:
        if self._rewriter is None:
            return Rewrite(query, RewriteOutcome.UNCHANGED)
        return self._rewriter(query)

    # -- off the hot path -----------------------------------------------------------------

    def _hand_off(self, bundle: ContextBundle, injection: Injection, candidates: int) -> None:
        at = self._clock()
        if self._recalls is not None:
            for r in bundle.facts:
                self._recalls.submit(Recall(r.fact.fact_id, at))
        if self._audit is not None:
            self._audit.submit(audit_row(bundle, injection, candidates, at))

    def _book(self, bundle: ContextBundle, embedded: bool, rewrite: Rewrite) -> None:
        """Hand the read's costs (query embedding, query rewrite) to the ledger writer."""
        if self._charges is None or self._ledger is None or bundle.log_id is None:
            return
        charge = ReadCharge(
            bundle.log_id,
            bundle.user_id,
            bundle.organization_id,
            self._clock(),
            embedded,
            rewrite.usage,
        )
        for entry in self._charges(charge):
            self._ledger.submit(entry)

    def _observe(self, bundle: ContextBundle, hit: bool, rewrite: Rewrite) -> None:
        if self._observer is not None:
            outcome = rewrite.outcome if self._rewriter is not None else None
            self._observer.assembled(bundle, hit, outcome)

    def close(self) -> None:
        """Write what the background writers hold (recall counters, audit rows)."""
        for writer in (self._recalls, self._audit, self._ledger):
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


def _without_repeats(
    ordered: list[tuple[uuid.UUID, float]], rows: Mapping[uuid.UUID, Fact], pinned: Sequence[Fact]
) -> list[tuple[uuid.UUID, float]]:
    """Drop a fact whose text repeats a pinned or a better-ranked one (vectors or not)."""
    seen = {normalize_content(f.content) for f in pinned}
    out = []
    for fid, score in ordered:
        key = normalize_content(rows[fid].content)
        if key not in seen:
            seen.add(key)
            out.append((fid, score))
    return out
