"""From a backend's answer to the exact `MemoryUpdate` a run writes.

Pure: the same request, response and run id give the same update. The backend proposes; this
module decides. Explicit data beats synthesis: scaffold updates from the inbox cycle are
written to S as given, learned facts and connection updates are appended as given, whatever
the model did with them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict
from datetime import datetime
from typing import Any

from domain.codec import fact_to_json
from domain.ids import normalize_content
from domain.model import (
    MAX_LEARNED_INFO,
    Fact,
    FactChange,
    LedgerEntry,
    MemoryState,
    MemoryUpdate,
    RunRecord,
    RunStatus,
    TokenUsage,
)
from processors.cost import PriceTable, llm_entry
from processors.errors import UnusableAnswer
from processors.gate import WriteGate
from processors.lifecycle import FactLedger
from processors.normalize import (
    apply_merge_patch,
    merge_json,
    normalize_json,
    storable_json,
    truncate_at_sentence,
)
from processors.schema import (
    MAX_SCAFFOLD_CHARS,
    MAX_WORKING_MEMORY_WORDS,
    BackendResponse,
    ConsolidationOutput,
    ConsolidationRequest,
)
from producers.contract import ContextEvent, EventType


def cap_words(text: str, limit: int = MAX_WORKING_MEMORY_WORDS) -> str:
    """At most `limit` words, ending on the last whole sentence that fits when one does."""
    return truncate_at_sentence(text.strip(), len(text), limit)


def bounded_scaffold(
    scaffold: Mapping[str, Any], limit: int = MAX_SCAFFOLD_CHARS, first: Collection[str] = ()
) -> dict[str, Any]:
    """The keys that fit while the JSON stays under `limit` characters, in their order; the
    keys in `first` (what events set by name) are taken before the others."""
    sizes = {
        k: len(json.dumps({k: v}, ensure_ascii=False, default=str)) for k, v in scaffold.items()
    }
    kept: set[str] = set()
    size = 2
    for key in [*(k for k in scaffold if k in first), *(k for k in scaffold if k not in first)]:
        if size + sizes[key] <= limit:
            kept.add(key)
            size += sizes[key]
    return {str(k): v for k, v in scaffold.items() if k in kept}


def patched_scaffold(scaffold: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """S after the answer's `updated_scaffold`, a merge patch of it (`apply_merge_patch`).

    A patch, not the whole object: S may hold up to MAX_SCAFFOLD_CHARS, some 20,000 tokens
    of CJK text, and an answer that had to copy it out would end at its output limit
    (MAX_TOKENS, the batch bisected and dead-lettered, every run of that user alike) or
    its timeout. A patch grows with what changed, not with S; an answer without S (the
    seed's shape) changes nothing in it."""
    patched = apply_merge_patch(dict(scaffold), normalize_json(dict(patch)))
    return patched if isinstance(patched, dict) else {}


def wiping_answer(before: MemoryState, output: ConsolidationOutput) -> str | None:
    """Why `output` must not be applied to `before`, or None.

    An answer that empties a non-empty W, or removes more than half of the keys of a
    non-empty S, is refused rather than applied: such an answer is a model slip or an
    instruction injected in an observation ("return an empty profile"), whose other changes
    are suspect too. Refused as an `UnusableAnswer`, the batch is bisected and the event it
    comes from dead-lettered with this reason, where it can be seen and redriven; keeping the
    old W or S instead would pass the event as consolidated and hide it. Deleting a user's
    memory is the erasure API's job, never a consolidation's.
    """
    if before.working_memory.strip() and not output.updated_working_memory.strip():
        return "the answer empties the working memory"
    keys = set(before.scaffold)
    kept = keys & set(patched_scaffold(before.scaffold, output.updated_scaffold))
    removed = len(keys) - len(kept)
    if keys and 2 * removed > len(keys):
        return f"the answer removes {removed} of the scaffold's {len(keys)} keys"
    return None


class Consolidator:
    def __init__(self, gate: WriteGate, prices: PriceTable) -> None:
        self._gate = gate
        self._prices = prices

    @property
    def prices(self) -> PriceTable:
        return self._prices

    def plan(
        self,
        request: ConsolidationRequest,
        response: BackendResponse,
        *,
        run_id: uuid.UUID,
        backend: str,
        prompt_version: str,
        started_at: datetime,
        duration_ms: int,
        attempt: int = 0,
        unshown: Sequence[Fact] = (),
    ) -> MemoryUpdate:
        """The run's update. `unshown`: the memory's stored facts (any status) among
        `unshown_ids`, so that a fact stated again goes on with its row."""
        self.check(request, response)
        asked, request = request, self._planned_on(request)
        output = response.output
        ledger = self._ledger(request, run_id, unshown)
        proposals = output.all_proposals()
        self._gate.prepare(proposals, request.active_facts)
        for proposal in proposals:
            ledger.apply(proposal)

        proposed = patched_scaffold(request.state.scaffold, output.updated_scaffold)
        scaffold, left_out = self._scaffold(request, proposed)
        state = MemoryState(
            user_id=request.user_id,
            organization_id=request.organization_id,
            working_memory=cap_words(output.updated_working_memory),
            scaffold=scaffold,
            learned_info=self._learned_info(request),
            version=request.state.version + 1,
            updated_at=request.now,
        )
        changes = ledger.changes()
        connection_additions = _connection_additions(request)
        run = RunRecord(
            run_id=run_id,
            user_id=request.user_id,
            organization_id=request.organization_id,
            input_event_ids=tuple(o.event.event_id for o in request.observations),
            backend=backend,
            model=response.model,
            prompt_version=prompt_version,
            status=RunStatus.SUCCEEDED,
            started_at=started_at,
            duration_ms=duration_ms,
            base_version=request.state.version,
            output={
                "validated": output.model_dump(mode="json"),
                "gate_decisions": [asdict(d) for d in ledger.decisions],
                "applied": applied_effect(state, changes, connection_additions),
                "candidates": shown_facts(request),
                **({"scaffold_left_out": left_out} if left_out else {}),
            },
            raw_response=response.raw_response,
            gate=ledger.counts(),
            usage=response.usage,
            cost_micro_usd=self._prices.llm_cost_micro_usd(response.model, response.usage),
            attempt=attempt,
        )
        entry = llm_entry(
            self._prices,
            run_id=run_id,
            key=request.key,
            model=response.model,
            usage=response.usage,
            at=request.now,
        )
        planned = MemoryUpdate(
            run=run,
            state=state,
            fact_changes=changes,
            connection_additions=connection_additions,
            ledger=(entry,),
        )
        return self._completed(asked, planned)

    @staticmethod
    def check(request: ConsolidationRequest, response: BackendResponse) -> None:
        """Raise `UnusableAnswer` if the answer would wipe memory (`wiping_answer`), carrying
        its text and usage: the call was paid for. Callers check before they probe or apply,
        so a bisection finds the event such an answer comes from."""
        reason = wiping_answer(request.state, response.output)
        if reason is not None:
            raise UnusableAnswer(reason, raw_response=response.raw_response, usage=response.usage)

    def unshown_ids(
        self, request: ConsolidationRequest, response: BackendResponse
    ) -> list[uuid.UUID]:
        """The ids the response's proposals would give facts, less those of the facts the run
        was shown: the caller looks them up in the memory and passes them to `plan`."""
        request = self._planned_on(request)
        ledger = self._ledger(request, uuid.UUID(int=0))  # only derives ids: no run
        shown = {f.fact_id for f in request.active_facts}
        derived = {ledger.derived_id(p) for p in response.output.all_proposals()}
        return sorted(derived - shown)

    def _ledger(
        self, request: ConsolidationRequest, run_id: uuid.UUID, unshown: Sequence[Fact] = ()
    ) -> FactLedger:
        return FactLedger(
            key=request.key,
            run_id=run_id,
            now=request.now,
            active=request.active_facts,
            observations=request.observations,
            gate=self._gate,
            unshown=unshown,
        )

    def _planned_on(self, request: ConsolidationRequest) -> ConsolidationRequest:
        """The request as the gate and the ledger see it (a subclass may narrow it)."""
        return request

    def _completed(self, request: ConsolidationRequest, update: MemoryUpdate) -> MemoryUpdate:
        """The planned update, given the request as asked (a subclass may add to it)."""
        return update

    @staticmethod
    def _scaffold(
        request: ConsolidationRequest, proposed: Mapping[str, Any]
    ) -> tuple[dict[str, Any], list[str]]:
        """S after the run, and the keys left out of it for its size (recorded in the run's
        output: a key an event set and S had no room for is not dropped unseen)."""
        normalized = normalize_json(dict(proposed))
        scaffold = dict(normalized) if isinstance(normalized, dict) else {}
        before = request.state.scaffold
        named = set()
        for obs in request.observations:
            event = obs.event
            if event.event_type is EventType.SCAFFOLD_UPDATE and event.scaffold_key is not None:
                # Whatever the model made of the key, the event's value is in it, merged as
                # the offline backend merges it; a key the answer removed starts from S before.
                key = event.scaffold_key
                base = scaffold[key] if key in scaffold else normalize_json(before.get(key))
                scaffold[key] = merge_json(base, normalize_json(event.scaffold_value()))
                named.add(key)
        whole = storable_json(scaffold)
        bounded = bounded_scaffold(whole, first=storable_json(sorted(named)))
        return bounded, [str(k) for k in whole if k not in bounded]

    @staticmethod
    def _learned_info(request: ConsolidationRequest) -> tuple[str, ...]:
        learned = list(request.state.learned_info)
        known = {normalize_content(x) for x in learned}
        for obs in request.observations:
            if obs.event.event_type is not EventType.LEARNED_FACT:
                continue
            key = normalize_content(obs.event.content)
            if key not in known:
                known.add(key)
                learned.append(obs.event.content)
        return tuple(learned[-MAX_LEARNED_INFO:])


def updated_connections(events: Sequence[ContextEvent]) -> list[str]:
    """The connections a batch's events add learned info to."""
    return sorted(
        {
            e.source_metadata.connection_id
            for e in events
            if e.event_type is EventType.CONNECTION_UPDATE and e.source_metadata.connection_id
        }
    )


def _connection_additions(request: ConsolidationRequest) -> dict[str, tuple[str, ...]]:
    # What a connection knows already, or this batch adds twice (a tool client sending its
    # update again without a key is a new event), is not added again: compared as the
    # memory's learned info is, case and spacing aside.
    additions: dict[str, list[str]] = {}
    known: dict[str, set[str]] = {}
    for obs in request.observations:
        event = obs.event
        connection = event.source_metadata.connection_id
        if event.event_type is not EventType.CONNECTION_UPDATE or connection is None:
            continue
        if connection not in known:
            known[connection] = {
                normalize_content(x) for x in request.connections.get(connection, ())
            }
        said = normalize_content(event.content)
        if said not in known[connection]:
            known[connection].add(said)
            additions.setdefault(connection, []).append(event.content)
    # A connection keeps its latest MAX_LEARNED_INFO lines (the store and the fold cut what it
    # had with these): more in one batch than that, only the latest are added.
    return {k: tuple(v[-MAX_LEARNED_INFO:]) for k, v in additions.items()}


def applied_effect(
    state: MemoryState,
    changes: tuple[FactChange, ...],
    connection_additions: Mapping[str, tuple[str, ...]],
) -> dict[str, Any]:
    """The run's effect in a form that folds back into memory without the backend."""
    return {
        "working_memory": state.working_memory,
        "scaffold": state.scaffold,
        "learned_info": list(state.learned_info),
        "version": state.version,
        "facts": [{"kind": c.kind.value, "after": fact_to_json(c.after)} for c in changes],
        "connection_additions": {k: list(v) for k, v in connection_additions.items()},
    }


def shown_facts(request: ConsolidationRequest) -> dict[str, Any]:
    """Which existing facts the backend was shown, in order, out of how many: a shadow replay
    of this run shows the same ones (see consumers.replay)."""
    return {
        "shown": [str(f.fact_id) for f in request.active_facts],
        "known": request.fact_count,
    }


def failed_run(
    request: ConsolidationRequest,
    *,
    run_id: uuid.UUID,
    backend: str,
    model: str,
    prompt_version: str,
    started_at: datetime,
    duration_ms: int,
    error: str | None,
    raw_response: str | None,
    attempt: int,
    status: RunStatus = RunStatus.FAILED,
    usage: TokenUsage | None = None,
    prices: PriceTable | None = None,
    output: Mapping[str, Any] | None = None,
) -> RunRecord:
    """A run that changed nothing: failed, deferred, or a discarded answer. A call that was
    answered still used tokens: `usage` priced by `prices` (see `unapplied_ledger`)."""
    usage = usage or TokenUsage()
    return RunRecord(
        run_id=run_id,
        user_id=request.user_id,
        organization_id=request.organization_id,
        input_event_ids=tuple(o.event.event_id for o in request.observations),
        backend=backend,
        model=model,
        prompt_version=prompt_version,
        status=status,
        started_at=started_at,
        duration_ms=duration_ms,
        base_version=request.state.version,
        output=output,
        raw_response=raw_response,
        usage=usage,
        cost_micro_usd=prices.llm_cost_micro_usd(model, usage) if prices else 0,
        error=error,
        attempt=attempt,
    )


def unapplied_ledger(prices: PriceTable, run: RunRecord) -> tuple[LedgerEntry, ...]:
    """What a run that changed nothing owes: its tokens, if the backend used any. The entry's
    id derives from the run's, so recording the run again books nothing twice."""
    if run.usage.total == 0:
        return ()
    entry = llm_entry(
        prices,
        run_id=run.run_id,
        key=run.key,
        model=run.model,
        usage=run.usage,
        at=run.started_at,
    )
    return (entry,)
