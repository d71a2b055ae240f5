"""Shadow replay: a user's raw events consolidated again, by another backend, model or prompt.

The shadow namespace is an in-memory image, not a Postgres schema: `Consolidator.plan` is pure
and records its effect in the same foldable form as a live run, so folding the shadow runs
gives what a shadow schema would hold, without a second copy of the migrations, without
cleanup, and without any connection that could write to live memory. The batches are cut as
the processor cuts them, or as the live runs did (`batches_like_live`), so that a diff against
live memory shows what the backend changes and not what batching changes.

Cut as the live runs were, the shadow also makes each recorded maintenance run's decisions
again at its place in the run order (`processors.recorded_maintenance`). An event a fact
erasure redacted is left out, as a flush leaves it out (`unredacted`); what the erasure did to
memory (text redacted in W, S, learned info) cannot be made again (`diff.split_erased`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from consumers.batch_retry import LIVE_DEFAULTS, BatchRetry
from consumers.replay_result import FailedBatch, ReplayStopped, ShadowResult
from consumers.splitting import MAX_SPLIT_CALLS, PROBE_NOTE, Answered, consolidate_isolated
from domain.ids import MemoryKey, occurrence_run_id, run_id_for
from domain.model import Fact, LoggedRun, RunRecord, RunStatus, TokenUsage
from domain.ports import Embedder
from processors.candidates import CandidatePolicy, retraction_targets, select_candidates
from processors.consolidate import Consolidator, failed_run
from processors.errors import (
    BackendError,
    CredentialsRefused,
    TransientBackendError,
    UnusableAnswer,
)
from processors.fold import FoldedMemory, fold_run
from processors.recorded_maintenance import is_maintenance, recorded_update
from processors.schema import (
    REQUEST_STATUSES,
    BackendResponse,
    ConsolidationBackend,
    ConsolidationRequest,
)
from producers.contract import RESERVED_CONTENTS, ContextEvent
from store.inmemory import InMemoryFactSearch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShadowBatch:
    events: tuple[ContextEvent, ...]
    now: datetime
    # The facts the live run showed its backend, in order (None: select them as live does).
    shown: tuple[uuid.UUID, ...] | None = None


@dataclass(frozen=True)
class MaintenanceStep:
    """A recorded maintenance run, made again at its place in the run order."""

    run: RunRecord


Step = ShadowBatch | MaintenanceStep


def unredacted(
    events: Sequence[ContextEvent],
) -> tuple[list[ContextEvent], tuple[uuid.UUID, ...]]:
    """(the events a flush consolidates, the ids of those a fact erasure redacted in the log):
    a flush drops an event of the erasure's marker (`store.write.flush_sql.redacted`)."""
    kept = [e for e in events if e.content not in RESERVED_CONTENTS]
    left_out = tuple(e.event_id for e in events if e.content in RESERVED_CONTENTS)
    return kept, left_out


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
) -> list[Step]:
    """The batches the live runs consolidated, at their clocks, and the maintenance runs
    between them; then what no run took yet.

    With the live backend this reproduces live memory but for what a fact erasure did to it
    (see above), so a diff shows only what the other backend, model or prompt changes. Events
    not in `events` (`unredacted`) are left out of their batches; a batch of none is none.
    """
    by_id = {e.event_id: e for e in events}
    taken: set[uuid.UUID] = set()
    out: list[Step] = []
    for logged in runs:
        run = logged.run
        if is_maintenance(run):
            out.append(MaintenanceStep(run))
            continue
        if run.status is not RunStatus.SUCCEEDED:
            continue
        chunk = tuple(by_id[i] for i in run.input_event_ids if i in by_id)
        taken.update(e.event_id for e in chunk)
        if chunk:
            out.append(ShadowBatch(chunk, run.started_at, _shown(run)))
    rest = [e for e in events if e.event_id not in taken]
    return [*out, *batches_by_size(rest, max_batch)]


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
    batches: Sequence[Step],
    backend: ConsolidationBackend,
    consolidator: Consolidator,
    *,
    embedder: Embedder | None = None,
    policy: CandidatePolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
    max_split_calls: int = MAX_SPLIT_CALLS,
    retry: BatchRetry = LIVE_DEFAULTS,
) -> ShadowResult:
    """Consolidate the batches into an in-memory image; nothing is written anywhere.

    Each batch is shown the facts a live flush would show it (`shown_facts`; `embedder` for
    the dense side of the search). A transient error is retried as a live flush retries one
    memory's batch (`retry`: the wait the provider asked for, bounded attempts). A batch the
    model cannot answer is bisected as a live flush bisects it
    (`consumers.splitting`, at most `max_split_calls` probes): its other events are
    consolidated, and only those that fail alone are recorded as failed, as the processor
    would dead-letter them. Any other backend error fails what of the batch no run took.
    A maintenance step makes its recorded decisions again to the facts the shadow holds.
    A refusal of the credentials raises `ReplayStopped` at once: no other call can succeed.
    """
    shadow = _Shadow(key, backend, consolidator, embedder, policy, sleep, retry)
    try:
        for step in batches:
            if isinstance(step, MaintenanceStep):
                shadow.maintain(step.run)
            else:
                shadow.consolidate(step, max_split_calls)
    except CredentialsRefused as e:
        raise ReplayStopped(str(e), shadow.result()) from e
    return shadow.result()


class _Answer(NamedTuple):
    """A usable answer: what `_call` returned for its request."""

    request: ConsolidationRequest
    response: BackendResponse
    duration_ms: int
    attempt: int  # the transient failures before it


class _Shadow:
    """One replay under way: the image so far, its runs, what failed, the calls no run took."""

    def __init__(
        self,
        key: MemoryKey,
        backend: ConsolidationBackend,
        consolidator: Consolidator,
        embedder: Embedder | None,
        policy: CandidatePolicy | None,
        sleep: Callable[[float], None],
        retry: BatchRetry,
    ) -> None:
        self.memory = FoldedMemory(user_id=key.user_id, organization_id=key.organization_id)
        self.runs: list[RunRecord] = []
        self.failed: list[FailedBatch] = []
        self.unapplied: list[RunRecord] = []
        self.maintenance: list[RunRecord] = []
        self._taken: set[uuid.UUID] = set()
        self._backend = backend
        self._consolidator = consolidator
        self._embedder = embedder
        self._policy = policy
        self._sleep = sleep
        self._retry = retry

    def result(self) -> ShadowResult:
        return ShadowResult(
            self.memory,
            tuple(self.runs),
            tuple(self.failed),
            tuple(self.unapplied),
            tuple(self.maintenance),
        )

    def consolidate(self, batch: ShadowBatch, max_split_calls: int) -> None:
        try:
            try:
                self._run(batch)
            except UnusableAnswer as error:
                self._split(batch, error, max_split_calls)
        except CredentialsRefused:
            raise  # about the key, never this batch: the whole replay stops
        except BackendError as error:
            left = tuple(e.event_id for e in batch.events if e.event_id not in self._taken)
            if left:
                self.failed.append(FailedBatch(left, str(error)))

    def maintain(self, recorded: RunRecord) -> None:
        update = recorded_update(recorded, self.memory.state(), self.memory.facts)
        if update is None:  # none of the facts it changed is in the shadow as it found them
            return
        self.maintenance.append(update.run)
        at = update.run.started_at
        self.memory = fold_run(self.memory, LoggedRun(self.memory.last_seq + 1, at, update.run))

    def _split(self, batch: ShadowBatch, error: UnusableAnswer, max_split_calls: int) -> None:
        def part(group: Sequence[ContextEvent]) -> ShadowBatch:
            # A part of a batch is shown what a search finds for it, as a live flush's is.
            return ShadowBatch(tuple(group), batch.now)

        def probe(group: Sequence[ContextEvent]) -> str | Answered[_Answer]:
            request = self._request(part(group))
            try:
                return Answered(_Answer(request, *self._call(request)))
            except UnusableAnswer as e:
                return str(e)

        def reuse(group: Sequence[ContextEvent], answer: _Answer) -> RunRecord | None:
            # As a live flush: the probe's answer, if nothing was applied since it was asked.
            same = answer.request.state.version == self.memory.version
            return self._run(part(group), answer) if same else None

        found = consolidate_isolated(
            batch.events, str(error), probe, lambda g: self._run(part(g)), max_split_calls,
            reuse=reuse, discard=self._discard,
        )  # fmt: skip
        n = len(batch.events)
        bisected = f" (bisected out of a batch of {n})" if n > 1 else ""
        self.failed.extend(
            FailedBatch(tuple(e.event_id for e in group), f"{why}{bisected}")
            for group, why in found.failing
        )
        self.failed.extend(
            FailedBatch(tuple(e.event_id for e in group), why) for group, why in found.unanswered
        )

    def _discard(self, answer: _Answer) -> None:
        """A probe's answer not applied: paid for all the same."""
        request, response, duration_ms, attempt = answer
        usage, model, raw = response.usage, response.model, response.raw_response
        discarded = {"discarded": PROBE_NOTE}
        self._kept(request, RunStatus.DISCARDED, usage, model, duration_ms, attempt,
                   error=None, raw_response=raw, output=discarded)  # fmt: skip

    def _request(self, batch: ShadowBatch) -> ConsolidationRequest:
        m = self.memory
        facts, known = shown_facts(m, batch, self._embedder, self._policy)
        return ConsolidationRequest.build(
            m.state(), facts, list(batch.events), batch.now, known, m.connections
        )

    def _run(self, batch: ShadowBatch, probed: _Answer | None = None) -> RunRecord:
        """`probed`: a probe's answer for this batch on this memory, applied without a call."""
        if probed is None:
            request = self._request(batch)
            probed = _Answer(request, *self._call(request))
        request, response, duration_ms, attempt = probed
        stored = self.memory.facts
        unshown = self._consolidator.unshown_ids(request, response)
        run = self._consolidator.plan(
            request,
            response,
            run_id=run_id_for(request.key, request.event_ids),
            backend=self._backend.name,
            prompt_version=self._backend.prompt_version,
            started_at=request.now,
            duration_ms=duration_ms,
            attempt=attempt,
            unshown=[stored[i] for i in unshown if i in stored],
        ).run
        self.runs.append(run)
        self._taken.update(run.input_event_ids)
        self.memory = fold_run(self.memory, LoggedRun(self.memory.last_seq + 1, batch.now, run))
        return run

    def _call(self, request: ConsolidationRequest) -> tuple[BackendResponse, int, int]:
        """(the answer, its call's milliseconds, the transient failures before it). Every
        call that raised is kept with the tokens the backend says it used: billed all the
        same."""
        attempt = 0
        while True:
            started = time.monotonic()
            try:
                response = self._backend.consolidate(request)
                # As a live flush does: a probe refuses what `plan` would.
                self._consolidator.check(request, response)
                return response, _ms_since(started), attempt
            except BackendError as e:
                self._kept(
                    request,
                    RunStatus.FAILED,
                    e.usage,
                    self._backend.model,
                    _ms_since(started),
                    attempt,
                    error=str(e),
                    raw_response=e.raw_response,
                )
                if not isinstance(e, TransientBackendError) or isinstance(e, CredentialsRefused):
                    raise
                attempt += 1
                if attempt >= self._retry.attempts:
                    raise
                delay = self._retry.delay(attempt - 1, e)
                log.warning("shadow call failed (%s); retry in %.2fs", e, delay)
                self._sleep(delay)

    def _kept(
        self,
        request: ConsolidationRequest,
        status: RunStatus,
        usage: TokenUsage,
        model: str,
        duration_ms: int,
        attempt: int,
        **record: Any,
    ) -> None:
        """A call that became no run, kept as the live path records one: with its cost."""
        call = failed_run(
            request,
            run_id=occurrence_run_id(),
            backend=self._backend.name,
            model=model,
            prompt_version=self._backend.prompt_version,
            started_at=request.now,
            duration_ms=duration_ms,
            attempt=attempt,
            status=status,
            usage=usage,
            prices=self._consolidator.prices,
            **record,
        )
        self.unapplied.append(call)


def _ms_since(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
