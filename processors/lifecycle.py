"""Fact lifecycle: applying proposed operations to a user's facts, one run at a time.

A `FactLedger` is the working set of one run: the user's active facts plus what the run has
changed so far. Operations are applied in the order the backend proposed them, each through
the write gate, and the ledger remembers the first `before` of every fact so the run writes
one change per fact with its full history.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from domain.ids import MemoryKey, fact_id_for, normalize_content
from domain.model import (
    Fact,
    FactChange,
    FactChangeKind,
    FactStatus,
    FactType,
    GateCounts,
    Provenance,
)
from processors.evidence import closest_observation, merge_evidence, provenance_of
from processors.gate import GateDecision, Verdict, WriteGate
from processors.schema import FactOp, FactProposal, Observation
from producers.contract import ContextEvent

REINFORCE_CONFIDENCE_STEP = 0.05


@dataclass(frozen=True)
class Decision:
    """What happened to one proposal; recorded in the run for audit."""

    op: str
    content: str
    verdict: str
    reason: str
    fact_id: str | None = None


class FactLedger:
    def __init__(
        self,
        *,
        key: MemoryKey,
        run_id: uuid.UUID,
        now: datetime,
        active: Sequence[Fact],
        observations: Sequence[Observation],
        gate: WriteGate,
        unshown: Sequence[Fact] = (),
    ) -> None:
        self._key = key
        self._run_id = run_id
        self._now = now
        self._gate = gate
        self._initial: dict[uuid.UUID, Fact] = {f.fact_id: f for f in active}
        self._facts: dict[uuid.UUID, Fact] = dict(self._initial)
        # Stored facts of the memory the run was not shown (contradicted, stale, or not among
        # its candidates) whose content a proposal repeats: stated again, such a fact's row
        # goes on with its earlier evidence and counters instead of being written over.
        self._unshown = {f.fact_id: f for f in unshown if f.fact_id not in self._initial}
        self._before: dict[uuid.UUID, Fact | None] = {}
        self._kind: dict[uuid.UUID, FactChangeKind] = {}
        self._by_label = {o.label: o.event for o in observations}
        self._observations = list(observations)
        self.decisions: list[Decision] = []
        self._counts = dict.fromkeys(Verdict, 0)

    # -- public ---------------------------------------------------------------------------

    def apply(self, proposal: FactProposal) -> None:
        target = self._target(proposal)
        if proposal.op is FactOp.ADD or target is None:
            if proposal.op is FactOp.CLOSE_LOOP:
                self._record(proposal, Verdict.DISCARD, "close_loop target is not an active fact")
                return
            self._add(proposal, supersedes=None)
            return
        if target.pinned:
            self._pinned(proposal, target)
            return
        match proposal.op:
            case FactOp.REINFORCE:
                self._reinforce(target, proposal, "reinforced by the backend")
            case FactOp.UPDATE:
                self._update(target, proposal)
            case FactOp.CONTRADICT:
                self._add(proposal, supersedes=target)
            case FactOp.CLOSE_LOOP:
                self._close_loop(target, proposal)

    def derived_id(self, proposal: FactProposal) -> uuid.UUID:
        """The id a fact added from `proposal` has: its content's, within its connection."""
        return fact_id_for(self._key, proposal.content, self._provenance(proposal).connection_id)

    def changes(self) -> tuple[FactChange, ...]:
        return tuple(
            FactChange(kind=self._kind[fid], after=self._facts[fid], before=self._before[fid])
            for fid in self._kind
        )

    def counts(self) -> GateCounts:
        return GateCounts(
            allowed=self._counts[Verdict.ALLOW],
            held=self._counts[Verdict.HOLD],
            discarded=self._counts[Verdict.DISCARD],
            reinforced=self._counts[Verdict.REINFORCE],
        )

    # -- operations -----------------------------------------------------------------------

    def _add(self, proposal: FactProposal, supersedes: Fact | None) -> None:
        # A duplicate is reinforced only where it is shown wherever the proposal would be:
        # a fact of every turn, or of the proposal's own connection. Folded into another
        # connection's fact, a chat statement would never reach a turn without that one.
        scope = self._provenance(proposal).connection_id
        others = [
            f
            for f in self._active()
            if (supersedes is None or f.fact_id != supersedes.fact_id)
            and f.provenance.connection_id in (None, scope)
        ]
        decision = self._gate.judge(proposal, others)
        if decision.verdict is Verdict.DISCARD:
            self._record(proposal, decision.verdict, decision.reason)
            return
        if decision.verdict is Verdict.REINFORCE and decision.duplicate_of is not None:
            self._reinforce(decision.duplicate_of, proposal, decision.reason)
            if supersedes is not None:
                self._supersede(supersedes, decision.duplicate_of)
            return
        provenance = self._provenance(proposal)
        fact_id = fact_id_for(self._key, proposal.content, provenance.connection_id)
        existing = self._facts.get(fact_id) or self._unshown.get(fact_id)
        if existing is not None and existing.status is FactStatus.ACTIVE:
            self._restated(existing, proposal, decision, supersedes)
            return
        status = FactStatus.HELD if decision.verdict is Verdict.HOLD else FactStatus.ACTIVE
        fact = Fact(
            fact_id=fact_id,
            user_id=self._key.user_id,
            organization_id=self._key.organization_id,
            content=proposal.content,
            fact_type=proposal.type,
            surface=proposal.surface,
            status=status,
            confidence=proposal.confidence,
            salience=proposal.salience,
            provenance=provenance,
            created_by_run=self._run_id,
            created_at=self._now,
            updated_at=self._now,
            observed_at=self._observed_at(proposal),
            event_date=proposal.event_date,
            subject=proposal.subject,
        )
        if existing is not None:
            fact = _stated_again(existing, fact)
        self._put(fact, FactChangeKind.ADD if supersedes is None else FactChangeKind.CONTRADICT)
        self._record(proposal, decision.verdict, decision.reason, fact_id)
        if supersedes is not None and status is FactStatus.ACTIVE:
            self._supersede(supersedes, fact)

    def _reinforce(self, target: Fact, proposal: FactProposal, reason: str) -> None:
        if target.pinned:
            # Reached through the gate (a paraphrase of a pinned fact) or the same content:
            # a pinned fact is the user's word and no run changes it, not even its counters.
            self._record(proposal, Verdict.DISCARD, "repeats a pinned fact", target.fact_id)
            return
        fact = replace(
            target,
            reinforce_count=target.reinforce_count + 1,
            last_reinforced_at=self._now,
            confidence=min(
                1.0, max(target.confidence, proposal.confidence) + REINFORCE_CONFIDENCE_STEP
            ),
            salience=max(target.salience, proposal.salience),
            # A held fact observed again has earned its place.
            status=FactStatus.ACTIVE if target.status is FactStatus.HELD else target.status,
            updated_at=self._now,
            provenance=merge_evidence(target.provenance, self._evidence_ids(proposal)),
            observed_at=_latest(target.observed_at, self._observed_at(proposal)),
        )
        self._put(fact, FactChangeKind.REINFORCE)
        self._record(proposal, Verdict.REINFORCE, reason, fact.fact_id)

    def _restated(
        self,
        existing: Fact,
        proposal: FactProposal,
        decision: GateDecision,
        supersedes: Fact | None,
    ) -> None:
        """A proposal whose content has the id of an active fact. An update keeps the id of a
        fact's first content, so the fact may now say something else ("lives in Paris" under
        the id of "lives in Berlin"): going back to what it first said rewrites it, as an
        update would; reinforcing it would keep Paris and lose the correction."""
        if normalize_content(existing.content) == normalize_content(proposal.content):
            self._reinforce(existing, proposal, "same content as an active fact")
        elif existing.pinned:
            self._record(proposal, Verdict.DISCARD, "its id is a pinned fact's", existing.fact_id)
            return
        elif decision.verdict is Verdict.HOLD:
            # Held beside the fact it would rewrite, as a doubtful update is, it would need
            # the id that fact has.
            reason = f"{decision.reason}; its id is an active fact's, which it would rewrite"
            self._record(proposal, Verdict.DISCARD, reason)
            return
        else:
            self._rewrite(existing, proposal)
        if supersedes is not None and supersedes.fact_id != existing.fact_id:
            # A pinned fact is left as it was, so it may be in no change of this run.
            self._supersede(supersedes, self._facts.get(existing.fact_id, existing))

    def _update(self, target: Fact, proposal: FactProposal) -> None:
        decision: GateDecision = self._gate.judge(proposal, [])
        if decision.verdict is Verdict.DISCARD:
            self._record(proposal, decision.verdict, decision.reason)
            return
        if decision.verdict is Verdict.HOLD:
            # A doubtful rewrite does not overwrite what is believed: it is kept beside the
            # fact, held, as a doubtful contradiction is (and the decision log says so).
            self._add(proposal, supersedes=target)
            return
        self._rewrite(target, proposal)

    def _rewrite(self, target: Fact, proposal: FactProposal) -> None:
        fact = replace(
            target,
            content=proposal.content,
            fact_type=proposal.type,
            surface=proposal.surface,
            confidence=proposal.confidence,
            salience=proposal.salience,
            updated_at=self._now,
            version=target.version + 1,
            indexed_at=None,  # new content needs a new vector
            provenance=merge_evidence(target.provenance, self._evidence_ids(proposal)),
            observed_at=_latest(target.observed_at, self._observed_at(proposal)),
            event_date=proposal.event_date or target.event_date,
            subject=proposal.subject or target.subject,
        )
        self._put(fact, FactChangeKind.UPDATE)
        self._record(proposal, Verdict.ALLOW, "updated in place", fact.fact_id)

    def _supersede(self, old: Fact, new: Fact) -> None:
        fact = replace(
            old,
            status=FactStatus.CONTRADICTED,
            superseded_by=new.fact_id,
            updated_at=self._now,
            version=old.version + 1,
        )
        self._put(fact, FactChangeKind.CONTRADICT)

    def _close_loop(self, target: Fact, proposal: FactProposal) -> None:
        if target.fact_type is not FactType.OPEN_LOOP:
            self._record(proposal, Verdict.DISCARD, "close_loop target is not an open loop")
            return
        fact = replace(
            target, status=FactStatus.ARCHIVED, updated_at=self._now, version=target.version + 1
        )
        self._put(fact, FactChangeKind.CLOSE_LOOP)
        self._record(proposal, Verdict.ALLOW, "open loop closed", fact.fact_id)

    def _pinned(self, proposal: FactProposal, target: Fact) -> None:
        if proposal.op is FactOp.REINFORCE:
            self._record(proposal, Verdict.DISCARD, "pinned facts are not changed automatically")
            return
        # A pinned fact stays as it is; a competing statement is kept, but only as held.
        held = proposal.model_copy(
            update={"op": FactOp.ADD, "confidence": min(proposal.confidence, 0.59)}
        )
        self._add(held, supersedes=None)

    # -- helpers --------------------------------------------------------------------------

    def _active(self) -> list[Fact]:
        return [f for f in self._facts.values() if f.status is FactStatus.ACTIVE]

    def _target(self, proposal: FactProposal) -> Fact | None:
        if not proposal.target_fact_id:
            return None
        try:
            fid = uuid.UUID(proposal.target_fact_id)
        except ValueError:
            return None
        fact = self._facts.get(fid)
        return fact if fact is not None and fact.status in _TARGETABLE else None

    def _put(self, fact: Fact, kind: FactChangeKind) -> None:
        fid = fact.fact_id
        if fid not in self._before:
            self._before[fid] = self._initial.get(fid) or self._unshown.get(fid)
        # A fact born in this run keeps the kind it was born with; an old one takes the latest.
        if fid in self._initial or fid in self._unshown or fid not in self._kind:
            self._kind[fid] = kind
        self._facts[fid] = fact

    def _record(
        self,
        proposal: FactProposal,
        verdict: Verdict,
        reason: str,
        fact_id: uuid.UUID | None = None,
    ) -> None:
        self._counts[verdict] += 1
        self.decisions.append(
            Decision(
                proposal.op.value,
                proposal.content,
                verdict.value,
                reason,
                str(fact_id) if fact_id else None,
            )
        )

    def _evidence_events(self, proposal: FactProposal) -> list[ContextEvent]:
        events = [self._by_label[label] for label in proposal.evidence if label in self._by_label]
        if events:
            return events
        return [closest_observation(proposal.content, self._observations)]

    def _observed_at(self, proposal: FactProposal) -> datetime:
        """When the events behind a proposal happened: the latest of them."""
        return max(e.occurred_at for e in self._evidence_events(proposal))

    def _evidence_ids(self, proposal: FactProposal) -> tuple[uuid.UUID, ...]:
        return tuple(e.event_id for e in self._evidence_events(proposal))

    def _provenance(self, proposal: FactProposal) -> Provenance:
        return provenance_of(self._evidence_events(proposal))


_TARGETABLE = frozenset({FactStatus.ACTIVE, FactStatus.HELD})


def _latest(a: datetime | None, b: datetime) -> datetime:
    return b if a is None else max(a, b)


def _stated_again(stored: Fact, fact: Fact) -> Fact:
    """`fact`, new from a proposal, over the stored fact of the same content: what the
    statement says now (status, type, scores, dates) on the row that keeps its evidence,
    counters and creation. The statement counts as a reinforcement, so the fact ages from now;
    a duplicate the sweep merged into another fact handed its reinforcements to that one and
    counts afresh (a later merge would count them twice)."""
    merged = stored.status is FactStatus.ARCHIVED and stored.superseded_by is not None
    return replace(
        stored,
        reinforce_count=0 if merged else stored.reinforce_count + 1,
        last_reinforced_at=fact.updated_at,
        content=fact.content,
        fact_type=fact.fact_type,
        surface=fact.surface,
        status=fact.status,
        confidence=fact.confidence,
        salience=fact.salience,
        superseded_by=None,
        updated_at=fact.updated_at,
        observed_at=max((t for t in (stored.observed_at, fact.observed_at) if t), default=None),
        event_date=fact.event_date or stored.event_date,
        subject=fact.subject or stored.subject,
        provenance=merge_evidence(stored.provenance, fact.provenance.source_event_ids),
        indexed_at=None,
        version=stored.version + 1,
    )
