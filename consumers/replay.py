"""Shadow replay: a user's raw events consolidated again, by another backend, model or prompt.

The shadow namespace is an in-memory image, not a Postgres schema: `Consolidator.plan` is pure
and records its effect in the same foldable form as a live run, so folding the shadow runs
gives what a shadow schema would hold, without a second copy of the migrations, without
cleanup, and without any connection that could write to live memory. The batches are cut as
the processor cuts them, or as the live runs did (`batches_like_live`), so that a diff against
live memory shows what the backend changes and not what batching changes.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from domain.ids import MemoryKey, run_id_for
from domain.model import Fact, LoggedRun, RunRecord, RunStatus
from domain.ports import Embedder
from domain.retry import Backoff
from processors.candidates import CandidatePolicy, retraction_targets, select_candidates
from processors.consolidate import Consolidator
from processors.errors import BackendError, TransientBackendError
from processors.fold import FoldedMemory, fold_run
from processors.schema import REQUEST_STATUSES, ConsolidationBackend, ConsolidationRequest
from producers.contract import ContextEvent
from store.inmemory import InMemoryFactSearch

SHADOW_ATTEMPTS = 3
# A replay is one analyst's sequential command, not a service: a short wait, then the batch is
# given up. No jitter: there is no crowd of retries to spread out.
SHADOW_BACKOFF = Backoff(base_s=1.0, max_s=8.0, jitter=0.0)


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
        # A run records what its backend was shown, which leaves out the facts its batch
        # retracts; the request carried them (as `select_candidates` adds them), and the
        # retraction is applied to them.
        by_id = {f.fact_id: f for f in image}
        shown = [i for i in batch.shown if i in by_id]
        named = {i for i in retraction_targets(batch.events) if i in by_id} - set(shown)
        retracted = sorted(named, key=str)
        return tuple(by_id[i] for i in [*shown, *retracted]), len(image)
    search = InMemoryFactSearch.over(image, embedder)
    chosen = select_candidates(memory.state().key, batch.events, search, policy)
    return chosen.facts, chosen.known


def shadow_consolidate(
    key: MemoryKey,
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
    memory = FoldedMemory(user_id=key.user_id, organization_id=key.organization_id)
    runs: list[RunRecord] = []
    failed: list[FailedBatch] = []
    for batch in batches:
        facts, known = shown_facts(memory, batch, embedder, policy)
        request = ConsolidationRequest.build(
            memory.state(), facts, list(batch.events), batch.now, known, memory.connections
        )
        try:
            run = _plan(request, backend, consolidator, sleep, memory.facts)
        except BackendError as error:
            failed.append(FailedBatch(tuple(x.event_id for x in batch.events), str(error)))
            continue
        runs.append(run)
        memory = fold_run(memory, LoggedRun(memory.last_seq + 1, batch.now, run))
    return ShadowResult(memory, tuple(runs), tuple(failed))


def _plan(
    request: ConsolidationRequest,
    backend: ConsolidationBackend,
    consolidator: Consolidator,
    sleep: Callable[[float], None],
    stored: Mapping[uuid.UUID, Fact],
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
            sleep(SHADOW_BACKOFF.delay(attempt - 1))
    update = consolidator.plan(
        request,
        response,
        run_id=run_id_for(request.key, request.event_ids),
        backend=backend.name,
        prompt_version=backend.prompt_version,
        started_at=request.now,
        duration_ms=int((time.monotonic() - started) * 1000),
        attempt=attempt,
        unshown=[stored[i] for i in consolidator.unshown_ids(request, response) if i in stored],
    )
    return update.run
