"""The offline backend's working state for one batch: drafts of proposals and their steps."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Final

from domain.model import Fact, FactStatus
from processors.heuristics import Slot, candidates
from processors.schema import MAX_FACTS_PER_RUN, ConsolidationRequest, FactOp, FactProposal
from producers.contract import ContextEvent

MAX_EVIDENCE = 20


@dataclass
class Draft:
    """A proposal that later observations of the same batch may still merge into or drop."""

    proposal: FactProposal
    scope: str | None
    slot: Slot | None
    at: datetime
    alive: bool = True
    session: str | None = None
    subject: str | None = None
    last_text: str = ""  # the latest line merged in: the next one must go on with it

    def absorb(self, label: str, text: str, merged: str | None) -> None:
        """Another observation of the same thing: its evidence, and its new details if any."""
        if len(self.proposal.evidence) < MAX_EVIDENCE:
            self.proposal.evidence.append(label)
        self.last_text = text
        if merged is None:
            return
        update: dict[str, object] = {"content": merged}
        if self.proposal.op is FactOp.REINFORCE:
            update["op"] = FactOp.UPDATE  # a stored fact grows by the new details
        self.proposal = self.proposal.model_copy(update=update)

    def raise_to(self, salience: float, event_date: date | None) -> None:
        self.proposal = self.proposal.model_copy(
            update={
                "salience": max(self.proposal.salience, salience),
                "event_date": self.proposal.event_date or event_date,
            }
        )


@dataclass(frozen=True)
class Step:
    """What one observation means for the scaffold once duplicates and corrections are settled."""

    event: ContextEvent
    statement: str | None = None
    slot: Slot | None = None
    corrected: tuple[str, ...] = ()  # statements this one replaces
    subject: str | None = None  # who the statement is about, when not the user


@dataclass
class Plan:
    steps: list[Step] = field(default_factory=list)
    drafts: list[Draft] = field(default_factory=list)
    retired: set[str] = field(default_factory=set)  # ids of stored facts this batch contradicts

    def proposals(self) -> list[FactProposal]:
        """Live proposals in application order; over the cap, the least salient oldest go."""
        live = [d.proposal for d in self.drafts if d.alive]
        keep = sorted(range(len(live)), key=lambda i: (-live[i].salience, -i))[:MAX_FACTS_PER_RUN]
        return [live[i] for i in sorted(keep)]

    def live(self, scope: str | None) -> list[Draft]:
        """Live drafts of a scope, newest first; proposals the gate will refuse do not count."""
        return [d for d in reversed(self.drafts) if d.alive and d.scope == scope and d.last_text]


# Held facts count: observing one again is what earns it a place (the ledger activates it).
_BELIEVED: Final = frozenset({FactStatus.ACTIVE, FactStatus.HELD})


def believed(request: ConsolidationRequest, plan: Plan, near: str | None = None) -> list[Fact]:
    """Stored facts still believed after what this batch contradicted so far, newest first;
    with `near`, only the few sharing the most words with that text (`candidates`)."""
    pool = request.active_facts if near is None else candidates(near, request.active_facts, _text)
    facts = [f for f in pool if f.status in _BELIEVED and str(f.fact_id) not in plan.retired]
    return sorted(facts, key=lambda f: (f.updated_at, str(f.fact_id)), reverse=True)


def _text(fact: Fact) -> str:
    return fact.content
