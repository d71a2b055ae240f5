"""Replay and audit: a user's memory rebuilt from the logs, at any time, or by another backend.

- `fold_runs` rebuilds W, S, learned info, connection info and facts from the `applied` effect
  every succeeded run records. Pure and deterministic: no LLM, no database.
- `runs_until` picks the runs committed at or before a time, for "memory at time T".
- `shadow_consolidate` re-runs a user's raw events through another backend, model or prompt
  and folds the result with the same `fold_runs`; `diff_memory` compares two images.

The shadow namespace is an in-memory image, not a Postgres schema: `Consolidator.plan` is pure
and records its effect in the same foldable form as a live run, so folding the shadow runs
gives what a shadow schema would hold, without a second copy of the migrations, without
cleanup, and without any connection that could write to live memory.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any

import numpy as np

from processors.candidates import CandidatePolicy, select_candidates
from processors.consolidate import Consolidator
from processors.errors import BackendError, TransientBackendError
from processors.schema import ConsolidationBackend, ConsolidationRequest
from producers.contract import ContextEvent
from store.candidate_search import InMemoryFactSearch
from store.protocols import Embedder
from store.records import (
    ConnectionContext,
    Fact,
    FactStatus,
    MemoryState,
    RunRecord,
    RunStatus,
    run_id_for,
)
from store.run_log import LoggedRun
from store.serialization import fact_from_json, fact_to_json

# What the request to a backend sees of a user's facts (the processor reads the same).
REQUEST_STATUSES = (FactStatus.ACTIVE, FactStatus.HELD)
SHADOW_ATTEMPTS = 3


class ReplayError(Exception):
    """Base of the errors of replay and audit."""


class FoldError(ReplayError):
    """The run log cannot be folded: out of order, a version gap, or no recorded effect."""


def _real(value: float) -> float:
    # Postgres keeps confidence and salience as `real` and psycopg reads back its shortest
    # decimal form: do the same, so a fold equals the live row and a shadow run sees the
    # numbers a live run would.
    return float(str(np.float32(value)))


@dataclass(frozen=True)
class FoldedMemory:
    """One user's memory image: folded from runs, or read from the live tables."""

    user_id: str
    organization_id: str = ""
    working_memory: str = ""
    scaffold: Mapping[str, Any] = field(default_factory=dict)
    learned_info: tuple[str, ...] = ()
    version: int = 0
    updated_at: datetime | None = None
    connections: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    facts: Mapping[uuid.UUID, Fact] = field(default_factory=dict)
    last_seq: int = 0
    runs_folded: int = 0

    def state(self) -> MemoryState:
        return MemoryState(
            user_id=self.user_id,
            organization_id=self.organization_id,
            working_memory=self.working_memory,
            scaffold=dict(self.scaffold),
            learned_info=self.learned_info,
            version=self.version,
            updated_at=self.updated_at,
        )

    def facts_in(self, statuses: Sequence[FactStatus] = tuple(FactStatus)) -> tuple[Fact, ...]:
        """In the order the memory store lists them: created_at, then fact id."""
        wanted = frozenset(statuses)
        chosen = [f for f in self.facts.values() if f.status in wanted]
        return tuple(sorted(chosen, key=lambda f: (f.created_at, f.fact_id)))

    def to_json(self) -> dict[str, Any]:
        return {
            "user_id": self.user_id,
            "organization_id": self.organization_id,
            "version": self.version,
            "updated_at": None if self.updated_at is None else self.updated_at.isoformat(),
            "runs_folded": self.runs_folded,
            "working_memory": self.working_memory,
            "scaffold": dict(self.scaffold),
            "learned_info": list(self.learned_info),
            "connections": {k: list(v) for k, v in sorted(self.connections.items())},
            "facts": [fact_to_json(f) for f in self.facts_in()],
        }


def live_image(
    state: MemoryState, facts: Iterable[Fact], connections: Iterable[ConnectionContext]
) -> FoldedMemory:
    """The live tables as a `FoldedMemory`, so that live and folded images diff field by field."""
    return FoldedMemory(
        user_id=state.user_id,
        organization_id=state.organization_id,
        working_memory=state.working_memory,
        scaffold=dict(state.scaffold),
        learned_info=tuple(state.learned_info),
        version=state.version,
        updated_at=state.updated_at,
        connections={c.connection_id: tuple(c.learned_info) for c in connections},
        facts={f.fact_id: f for f in facts},
    )


# -- the fold ---------------------------------------------------------------------------------


def fold_runs(runs: Iterable[LoggedRun], start: FoldedMemory | None = None) -> FoldedMemory:
    """Fold succeeded runs, in log order, onto `start` (an empty memory by default).

    Failed and deferred runs changed nothing and are skipped. Raises FoldError when the log
    is out of order, mixes users, or has a succeeded run that does not continue the version
    the fold has reached (a gap: some run is missing).
    """
    memory = start
    for logged in runs:
        if memory is None:
            memory = FoldedMemory(user_id=logged.run.user_id)
        memory = _fold_one(memory, logged)
    if memory is None:
        raise FoldError("nothing to fold: no runs and no start memory")
    return memory


def _fold_one(memory: FoldedMemory, logged: LoggedRun) -> FoldedMemory:
    run = logged.run
    if logged.seq <= memory.last_seq:
        raise FoldError(f"run {run.run_id}: seq {logged.seq} after seq {memory.last_seq}")
    if run.user_id != memory.user_id:
        raise FoldError(f"run {run.run_id} is of user {run.user_id}, not {memory.user_id}")
    if run.status is not RunStatus.SUCCEEDED:
        return replace(memory, last_seq=logged.seq)
    if run.base_version != memory.version:
        raise FoldError(
            f"run {run.run_id} (seq {logged.seq}) was planned on version {run.base_version},"
            f" the fold is at version {memory.version}: a run is missing from the log"
        )
    applied = (run.output or {}).get("applied")
    if not isinstance(applied, Mapping):
        raise FoldError(f"run {run.run_id} (seq {logged.seq}) records no applied effect")
    try:
        return _apply(memory, run, logged.seq, applied)
    except (KeyError, TypeError, ValueError) as e:
        raise FoldError(f"run {run.run_id}: malformed applied effect: {e!r}") from e


def _apply(
    memory: FoldedMemory, run: RunRecord, seq: int, applied: Mapping[str, Any]
) -> FoldedMemory:
    facts = dict(memory.facts)
    for change in applied["facts"]:
        after = fact_from_json(change["after"])
        facts[after.fact_id] = merge_fact(facts.get(after.fact_id), after)
    connections = dict(memory.connections)
    for connection_id, additions in applied.get("connection_additions", {}).items():
        connections[connection_id] = (*connections.get(connection_id, ()), *additions)
    return FoldedMemory(
        user_id=memory.user_id,
        organization_id=run.organization_id,
        working_memory=str(applied["working_memory"]),
        scaffold=dict(applied["scaffold"]),
        learned_info=tuple(applied["learned_info"]),
        version=int(applied["version"]),
        updated_at=run.started_at,
        connections=connections,
        facts=facts,
        last_seq=seq,
        runs_folded=memory.runs_folded + 1,
    )


def merge_fact(stored: Fact | None, after: Fact) -> Fact:
    """What `memory_facts` holds once `after` is upserted over `stored` (see store.fact_rows).

    The row keeps its identity, origin and read-path counters, counts every write in
    `version`, and a pinned row is never changed by a run.
    """
    after = replace(after, confidence=_real(after.confidence), salience=_real(after.salience))
    if stored is None:
        return after
    if stored.pinned:
        return stored
    return replace(
        after,
        user_id=stored.user_id,
        organization_id=stored.organization_id,
        provenance=replace(stored.provenance, source_event_ids=after.provenance.source_event_ids),
        pinned=stored.pinned,
        recall_count=stored.recall_count,
        last_recalled_at=stored.last_recalled_at,
        created_by_run=stored.created_by_run,
        created_at=stored.created_at,
        version=stored.version + 1,
    )


def runs_until(runs: Iterable[LoggedRun], at: datetime) -> list[LoggedRun]:
    """The runs committed at or before `at`: the log's prefix up to the first later one.

    `finished_at` is the time of the run's transaction, and one user's runs are serialized by
    the user lock, so a prefix is what memory was at `at`.
    """
    out: list[LoggedRun] = []
    for logged in runs:
        if logged.finished_at > at:
            break
        out.append(logged)
    return out


# -- shadow re-consolidation ------------------------------------------------------------------


@dataclass(frozen=True)
class ShadowBatch:
    events: tuple[ContextEvent, ...]
    now: datetime
    # The facts the live run showed its backend, in order (None: select them as live does).
    shown: tuple[uuid.UUID, ...] | None = None


@dataclass(frozen=True)
class FailedBatch:
    event_ids: tuple[uuid.UUID, ...]
    error: str


@dataclass(frozen=True)
class ShadowResult:
    memory: FoldedMemory
    runs: tuple[RunRecord, ...]
    failed: tuple[FailedBatch, ...]

    @property
    def prompt_tokens(self) -> int:
        return sum(r.usage.prompt_tokens for r in self.runs)

    @property
    def completion_tokens(self) -> int:
        return sum(r.usage.completion_tokens for r in self.runs)

    @property
    def cost_micro_usd(self) -> int:
        return sum(r.cost_micro_usd for r in self.runs)


def batches_by_size(events: Sequence[ContextEvent], max_batch: int) -> list[ShadowBatch]:
    """Log order, `max_batch` at a time, as the processor cuts a user's buffer.

    The clock of a batch is its latest event (never going back), so a replay is reproducible.
    """
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    out: list[ShadowBatch] = []
    now: datetime | None = None
    for i in range(0, len(events), max_batch):
        chunk = tuple(events[i : i + max_batch])
        latest = max(e.occurred_at for e in chunk)
        now = latest if now is None else max(now, latest)
        out.append(ShadowBatch(chunk, now))
    return out


def batches_like_live(
    events: Sequence[ContextEvent], runs: Iterable[LoggedRun], max_batch: int
) -> list[ShadowBatch]:
    """The batches the live runs consolidated, at their clocks; then what no run took yet.

    With the live backend this reproduces live memory, so a diff shows only what the other
    backend, model or prompt changes, not what batching changes.
    """
    by_id = {e.event_id: e for e in events}
    taken: set[uuid.UUID] = set()
    out: list[ShadowBatch] = []
    for logged in runs:
        run = logged.run
        if run.status is not RunStatus.SUCCEEDED:
            continue
        chunk = tuple(by_id[i] for i in run.input_event_ids if i in by_id)
        taken.update(e.event_id for e in chunk)
        if chunk:
            out.append(ShadowBatch(chunk, run.started_at, _shown(run)))
    rest = [e for e in events if e.event_id not in taken]
    return out + batches_by_size(rest, max_batch)


def _shown(run: RunRecord) -> tuple[uuid.UUID, ...] | None:
    """The candidates a run recorded; None for runs from before candidates were recorded."""
    candidates = (run.output or {}).get("candidates")
    if not isinstance(candidates, Mapping):
        return None
    return tuple(uuid.UUID(str(i)) for i in candidates.get("shown", ()))


def shown_facts(
    memory: FoldedMemory,
    batch: ShadowBatch,
    embedder: Embedder | None,
    policy: CandidatePolicy | None,
) -> tuple[tuple[Fact, ...], int]:
    """(the facts the batch's backend sees, how many the user has), as a live flush picks
    them; a batch of a live run sees the very facts that run saw."""
    image = memory.facts_in(REQUEST_STATUSES)
    if batch.shown is not None:
        by_id = {f.fact_id: f for f in image}
        return tuple(by_id[i] for i in batch.shown if i in by_id), len(image)
    search = InMemoryFactSearch(image, embedder)
    org = batch.events[0].organization_id
    chosen = select_candidates(memory.user_id, org, batch.events, search, policy)
    return chosen.facts, chosen.known


def shadow_consolidate(
    user_id: str,
    batches: Sequence[ShadowBatch],
    backend: ConsolidationBackend,
    consolidator: Consolidator,
    *,
    embedder: Embedder | None = None,
    policy: CandidatePolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> ShadowResult:
    """Consolidate the batches into an in-memory image; nothing is written anywhere.

    Each batch is shown the facts a live flush would show it (`shown_facts`; `embedder` for
    the dense side of the search). A batch the backend cannot handle is recorded as failed
    and skipped, as the processor would dead-letter it; a transient error is retried a few
    times with backoff first.
    """
    memory = FoldedMemory(user_id=user_id)
    runs: list[RunRecord] = []
    failed: list[FailedBatch] = []
    for batch in batches:
        if not memory.organization_id:
            memory = replace(memory, organization_id=batch.events[0].organization_id)
        facts, known = shown_facts(memory, batch, embedder, policy)
        request = ConsolidationRequest.build(
            memory.state(), facts, list(batch.events), batch.now, known_facts=known
        )
        try:
            run = _plan(request, backend, consolidator, sleep)
        except BackendError as error:
            failed.append(FailedBatch(tuple(x.event_id for x in batch.events), str(error)))
            continue
        runs.append(run)
        memory = _fold_one(memory, LoggedRun(memory.last_seq + 1, batch.now, run))
    return ShadowResult(memory, tuple(runs), tuple(failed))


def _plan(
    request: ConsolidationRequest,
    backend: ConsolidationBackend,
    consolidator: Consolidator,
    sleep: Callable[[float], None],
) -> RunRecord:
    attempt = 0
    while True:
        started = time.monotonic()
        try:
            response = backend.consolidate(request)
            break
        except TransientBackendError:
            attempt += 1
            if attempt >= SHADOW_ATTEMPTS:
                raise
            sleep(2.0 ** (attempt - 1))
    update = consolidator.plan(
        request,
        response,
        run_id=run_id_for(request.user_id, request.event_ids),
        backend=backend.name,
        prompt_version=backend.prompt_version,
        started_at=request.now,
        duration_ms=int((time.monotonic() - started) * 1000),
        attempt=attempt,
    )
    return update.run


# -- diff -------------------------------------------------------------------------------------

# What a fact *says*; timestamps, versions and recall counters differ between any two runs.
DIFF_FIELDS = (
    "content",
    "fact_type",
    "surface",
    "status",
    "superseded_by",
    "pinned",
    "confidence",
    "salience",
    "reinforce_count",
)


@dataclass(frozen=True)
class FactDiff:
    fact_id: uuid.UUID
    content: str
    fields: Mapping[str, tuple[Any, Any]]  # name → (left, right)


@dataclass(frozen=True)
class MemoryDiff:
    """`left` is the reference (live memory), `right` the image compared with it."""

    only_left: tuple[Fact, ...]
    only_right: tuple[Fact, ...]
    changed: tuple[FactDiff, ...]
    working_memory: tuple[str, str] | None
    scaffold: Mapping[str, tuple[Any, Any]]  # key → (left, right); None where absent
    learned_info: tuple[tuple[str, ...], tuple[str, ...]]  # (only left, only right)
    connections: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]

    @property
    def identical(self) -> bool:
        return not (
            self.only_left
            or self.only_right
            or self.changed
            or self.working_memory
            or self.scaffold
            or any(self.learned_info)
            or self.connections
        )


def _comparable(fact: Fact, name: str) -> Any:
    value = getattr(fact, name)
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, uuid.UUID):
        return str(value)
    return value.value if isinstance(value, StrEnum) else value


def _fact_diff(left: Fact, right: Fact) -> FactDiff | None:
    fields_ = {
        name: (_comparable(left, name), _comparable(right, name))
        for name in DIFF_FIELDS
        if _comparable(left, name) != _comparable(right, name)
    }
    return FactDiff(left.fact_id, left.content, fields_) if fields_ else None


def _only(left: Sequence[str], right: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return tuple(x for x in left if x not in right), tuple(x for x in right if x not in left)


def diff_memory(left: FoldedMemory, right: FoldedMemory) -> MemoryDiff:
    """Facts are matched by id: UUID5 of (user, content, scope), the same in any namespace."""
    lf, rf = left.facts, right.facts
    changed = [d for fid in sorted(lf.keys() & rf.keys()) if (d := _fact_diff(lf[fid], rf[fid]))]
    keys = sorted({*left.scaffold, *right.scaffold})
    scaffold = {
        k: (left.scaffold.get(k), right.scaffold.get(k))
        for k in keys
        if left.scaffold.get(k) != right.scaffold.get(k)
    }
    connections = {}
    for c in sorted({*left.connections, *right.connections}):
        only = _only(left.connections.get(c, ()), right.connections.get(c, ()))
        if any(only):
            connections[c] = only
    return MemoryDiff(
        only_left=tuple(f for f in left.facts_in() if f.fact_id not in rf),
        only_right=tuple(f for f in right.facts_in() if f.fact_id not in lf),
        changed=tuple(changed),
        working_memory=None
        if left.working_memory == right.working_memory
        else (left.working_memory, right.working_memory),
        scaffold=scaffold,
        learned_info=_only(left.learned_info, right.learned_info),
        connections=connections,
    )
