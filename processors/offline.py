"""The offline backend: consolidation by deterministic rules, with no network and no API key.

It lets memoryd run end to end without an LLM (tests, demos, shadow replays) and makes a
replay byte-identical: the only clock is `request.now` and the events' own times, there is no
randomness, and every choice between equals is broken by a stable order.

Each observation becomes at most one compact statement (`processors.statements`): about its
speaker when a transcript names one, with relative dates resolved and content-free sentences
dropped. A statement that repeats a known fact reinforces it and adds what it says that is
new; in a transcript, a speaker's next statement on the same thread is merged into the fact
of their previous one, so one fact stands for a short exchange rather than for every line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Final, TypeVar

from domain.model import Fact, FactType, SurfacePolicy, TokenUsage
from domain.ports import Embedder
from processors.heuristics import (
    Similarity,
    Slot,
    approx_tokens,
    classify_slot,
    clip,
    first_sentences,
    is_fact_like,
    is_open_loop,
    someone_else,
    to_third_person,
)
from processors.merge import merge_details, thread_of
from processors.normalize import merge_patch_between
from processors.offline_memory import build_scaffold, build_working_memory
from processors.plan import Draft, Plan, Step, believed
from processors.schema import (
    MAX_FACT_CHARS,
    BackendResponse,
    ConsolidationOutput,
    ConsolidationRequest,
    FactOp,
    FactProposal,
    Observation,
)
from processors.speakers import split_speaker
from processors.statements import extract
from producers.contract import ContextEvent, EventType, Source

T = TypeVar("T")

TOOL_SUMMARY_CHARS = 300
# Salience moves with the source: the user saying it beats the inbox inferring it beats a tool.
_SOURCE_WEIGHTS: Final = {
    Source.INTERACTIVE: (0.85, 0.0),
    Source.AUTONOMOUS: (0.7, -0.15),
    Source.TOOL: (0.6, -0.35),
}
_FACT_TYPES: Final = {
    EventType.FACT: FactType.PROFILE,
    EventType.PREFERENCE: FactType.PREFERENCE,
    EventType.PROJECT_DETAILS: FactType.LORE,
    EventType.CORRECTION: FactType.PROFILE,
    EventType.LEARNED_FACT: FactType.PROFILE,
    EventType.TOOL_OUTPUT: FactType.LORE,
}
_SURFACES: Final = {
    FactType.PREFERENCE: SurfacePolicy.ADAPT,
    FactType.OPEN_LOOP: SurfacePolicy.CONTINUE,
}
# Only statements about the user carry a slot a correction may replace; a project that
# mentions "the team" is not the user's role.
_SLOTTED_TYPES: Final = frozenset({FactType.PROFILE, FactType.PREFERENCE})
# A line that states nothing is still proposed, so the write gate's verdict on it is counted,
# but below the gate's salience floor: the gate's own check is laxer (a written fact may leave
# its subject out) and would keep a reply such as "Glad you got some R&R after the drive".
_NO_INFORMATION_SALIENCE = 0.1


class OfflineBackend:
    """A `ConsolidationBackend`; the embedder, when given, only sharpens similarity."""

    name = "offline"
    model = "offline-deterministic-v2"
    prompt_version = "offline-v3"

    def __init__(self, embedder: Embedder | None = None) -> None:
        self._embedder = embedder

    def consolidate(self, request: ConsolidationRequest) -> BackendResponse:
        plan = plan_facts(request, self._embedder)
        scaffold = build_scaffold(request.state.scaffold, plan.steps)
        output = ConsolidationOutput(
            updated_working_memory=build_working_memory(scaffold, plan, request),
            # A merge patch of S, as a model is asked for (processors.consolidate).
            updated_scaffold=merge_patch_between(request.state.scaffold, scaffold),
            facts=plan.proposals(),
        )
        raw = json.dumps(output.model_dump(mode="json"), sort_keys=True, ensure_ascii=False)
        usage = TokenUsage(approx_tokens(_prompt_text(request)), approx_tokens(raw))
        return BackendResponse(output=output, raw_response=raw, usage=usage, model=self.model)


@dataclass(frozen=True)
class Extracted:
    """What one observation states, with what the plan needs to weigh it."""

    text: str
    subject: str | None = None
    event_date: date | None = None
    salience: float = 0.5
    confidence: float = 0.85
    informative: bool = True


def statement_for(event: ContextEvent, others: Iterable[str] = ()) -> Extracted | None:
    """The fact an event states, or None if it is no statement at all (a tool's table dump).

    `others` are the other speakers of the transcript, whom a line may address by name.
    """
    if event.event_type not in _FACT_TYPES:
        return None
    base_confidence, salience_offset = _SOURCE_WEIGHTS[event.source_metadata.source]
    if event.event_type is EventType.TOOL_OUTPUT:
        meta = event.source_metadata
        name = meta.filename or meta.attachment_id
        prefix = f"Attachment {clip(name, 80)}: " if name else ""
        # Tool text was written by someone else: its "I" is not the user, so no rewrite.
        summary = first_sentences(event.content, TOOL_SUMMARY_CHARS - len(prefix))
        if not is_fact_like(summary):
            return None
        return Extracted(prefix + summary, salience=0.3, confidence=base_confidence)
    flat = " ".join(event.content.split())
    if event.event_type is EventType.CORRECTION:
        # A correction is kept whole: every word of it may be what changed.
        speaker, _ = split_speaker(flat)
        text = clip(to_third_person(flat), MAX_FACT_CHARS)
        if not any(c.isalnum() for c in text):
            return None
        return Extracted(text, speaker, salience=0.9, confidence=0.95)
    statement = extract(flat, event.occurred_at, others)
    if statement is None:
        speaker, _ = split_speaker(flat)
        text = clip(to_third_person(flat), MAX_FACT_CHARS)
        if not any(c.isalnum() for c in text):
            return None
        return Extracted(text, speaker, salience=_NO_INFORMATION_SALIENCE, informative=False)
    salience = statement.signals.salience() + salience_offset
    return Extracted(
        clip(statement.text, MAX_FACT_CHARS),
        statement.subject,
        statement.event_date,
        salience=round(min(max(salience, 0.25), 0.95), 2),
        confidence=statement.signals.confidence(base_confidence),
    )


def plan_facts(request: ConsolidationRequest, embedder: Embedder | None) -> Plan:
    speakers = _speakers(request.observations)
    statements = {
        o.label: statement_for(o.event, speakers - {split_speaker(o.event.content)[0]})
        for o in request.observations
    }
    # Stored facts are embedded when a statement is compared with them, not all of them up front.
    sim = Similarity(embedder, [s.text for s in statements.values() if s])
    plan = Plan()
    attachments: set[tuple[str | None, str]] = set()
    for obs in request.observations:
        meta, statement = obs.event.source_metadata, statements[obs.label]
        attachment = (meta.tool_id, meta.attachment_id) if meta.attachment_id else None
        if statement is None or attachment in attachments:
            # One summary per attachment: its later chunks are the same document.
            plan.steps.append(Step(obs.event))
            continue
        if attachment is not None:
            attachments.add(attachment)
        if not statement.informative:
            plan.steps.append(_propose_uninformative(plan, obs, statement))
            continue
        is_correction = obs.event.event_type is EventType.CORRECTION
        if is_correction and _twin(plan, request, sim, statement.text, meta.connection_id) is None:
            plan.steps.append(_correct(plan, request, sim, obs, statement))
        else:
            plan.steps.append(_observe(plan, request, sim, obs, statement))
    return plan


def _speakers(observations: Sequence[Observation]) -> frozenset[str]:
    named = (split_speaker(o.event.content)[0] for o in observations)
    return frozenset(n for n in named if n)


def _in_scope(facts: Iterable[Fact], scope: str | None) -> list[Fact]:
    return [f for f in facts if f.provenance.connection_id == scope]


def _best(
    items: Sequence[T], text: str, content: Callable[[T], str], sim: Similarity, floor: float
) -> T | None:
    """The most similar item at or above `floor`; the first (newest) one wins a tie."""
    if not items:
        return None
    scores = sim.scores(text, [content(i) for i in items])
    best = max(range(len(items)), key=lambda i: (scores[i], -i))
    return items[best] if scores[best] >= floor else None


def _twin(
    plan: Plan, request: ConsolidationRequest, sim: Similarity, statement: str, scope: str | None
) -> Draft | Fact | None:
    draft = _best(plan.live(scope), statement, lambda d: d.proposal.content, sim, sim.duplicate)
    if draft is not None:
        return draft
    facts = _in_scope(believed(request, plan, near=statement), scope)
    return _best(facts, statement, lambda f: f.content, sim, sim.duplicate)


def _with_details(old: str, new: str) -> str | None:
    """`old` with the new details of `new`; None when there are none or they do not fit."""
    merged = merge_details(old, new)
    return None if merged == old else merged


def _observe(
    plan: Plan,
    request: ConsolidationRequest,
    sim: Similarity,
    obs: Observation,
    statement: Extracted,
) -> Step:
    event, scope = obs.event, obs.event.source_metadata.connection_id
    slot = classify_slot(statement.text) if statement.subject is None else None
    twin = _twin(plan, request, sim, statement.text, scope) or thread_of(
        plan, request, obs.event, statement.subject, statement.text, sim
    )
    if isinstance(twin, Draft):
        twin.absorb(obs.label, statement.text, _with_details(twin.proposal.content, statement.text))
        twin.raise_to(statement.salience, statement.event_date)
        return Step(event, twin.proposal.content, slot, subject=statement.subject)
    kind = _FACT_TYPES[event.event_type]
    if event.event_type is EventType.PROJECT_DETAILS and is_open_loop(statement.text):
        kind = FactType.OPEN_LOOP
    proposal = FactProposal(
        content=statement.text,
        type=kind,
        confidence=statement.confidence,
        salience=min(0.95, statement.salience + (0.1 if kind is FactType.OPEN_LOOP else 0.0)),
        surface=_SURFACES.get(kind, SurfacePolicy.SPEAK),
        evidence=[obs.label],
        subject=statement.subject,
        event_date=statement.event_date,
    )
    if twin is not None:
        merged = _with_details(twin.content, statement.text)
        proposal = proposal.model_copy(
            update={
                "op": FactOp.UPDATE if merged else FactOp.REINFORCE,
                "target_fact_id": str(twin.fact_id),
                "content": merged or twin.content,
                "type": twin.fact_type,
                "surface": twin.surface,
                "salience": max(twin.salience, proposal.salience),
                "event_date": proposal.event_date or twin.event_date,
                "subject": proposal.subject or twin.subject,
            }
        )
    plan.drafts.append(
        Draft(
            proposal,
            scope,
            slot,
            event.occurred_at,
            session=event.source_metadata.session_id,
            subject=statement.subject,
            last_text=statement.text,
        )
    )
    return Step(event, proposal.content, slot, subject=statement.subject)


def _propose_uninformative(plan: Plan, obs: Observation, statement: Extracted) -> Step:
    """Proposed as it is, for the write gate to turn down with a counted verdict."""
    proposal = FactProposal(
        content=statement.text,
        type=_FACT_TYPES[obs.event.event_type],
        confidence=statement.confidence,
        salience=statement.salience,
        evidence=[obs.label],
        subject=statement.subject,
    )
    plan.drafts.append(
        Draft(proposal, obs.event.source_metadata.connection_id, None, obs.event.occurred_at)
    )
    return Step(obs.event)


def _slot_match(
    items: Iterable[T],
    slot: Slot | None,
    slot_of: Callable[[T], Slot | None],
    type_of: Callable[[T], FactType],
) -> T | None:
    if slot is None:
        return None
    return next((i for i in items if type_of(i) in _SLOTTED_TYPES and slot_of(i) is slot), None)


def _correct(
    plan: Plan,
    request: ConsolidationRequest,
    sim: Similarity,
    obs: Observation,
    statement: Extracted,
) -> Step:
    """Replace the statement a correction is about: same slot first, else the most similar."""
    event, scope, text = obs.event, obs.event.source_metadata.connection_id, statement.text
    # What is said of the user's sister corrects only what was said of her, however many
    # words it shares with the user's own name or job.
    whose = someone_else(text)
    slot = classify_slot(text)
    drafts = [d for d in plan.live(scope) if someone_else(d.proposal.content) == whose]
    earlier = _slot_match(drafts, slot, lambda d: d.slot, lambda d: d.proposal.type) or _best(
        drafts, text, lambda d: d.proposal.content, sim, sim.related
    )
    target_id, corrected, kind = None, [], FactType.PROFILE
    if earlier is not None:
        # The consolidator can only contradict stored facts: an in-batch one is just dropped.
        earlier.alive = False
        target_id, kind = earlier.proposal.target_fact_id, earlier.proposal.type
        corrected.append(earlier.proposal.content)
        slot = slot or earlier.slot
    if target_id is None:
        facts = [
            f
            for f in _in_scope(believed(request, plan), scope)
            if not f.pinned and someone_else(f.content) == whose
        ]
        fact = _slot_match(
            facts, slot, lambda f: classify_slot(f.content), lambda f: f.fact_type
        ) or _best(facts, text, lambda f: f.content, sim, sim.related)
        if fact is not None:
            target_id, kind = str(fact.fact_id), fact.fact_type
            corrected.append(fact.content)
            slot = slot or classify_slot(fact.content)
    if target_id is not None:
        plan.retired.add(target_id)
    proposal = FactProposal(
        op=FactOp.CONTRADICT if target_id else FactOp.ADD,
        content=text,
        type=kind,
        confidence=statement.confidence,
        salience=statement.salience,
        surface=_SURFACES.get(kind, SurfacePolicy.SPEAK),
        target_fact_id=target_id,
        evidence=[obs.label],
        subject=statement.subject,
    )
    plan.drafts.append(
        Draft(proposal, scope, slot, event.occurred_at, subject=statement.subject, last_text=text)
    )
    return Step(event, text, slot, tuple(corrected), subject=statement.subject)


def _prompt_text(request: ConsolidationRequest) -> str:
    """What a prompt would carry, so offline runs cost something comparable to an LLM's."""
    scaffold = json.dumps(dict(request.state.scaffold), sort_keys=True, default=str)
    parts = [request.state.working_memory, scaffold]
    parts += [f.content for f in request.active_facts]
    parts += [o.event.content for o in request.observations]
    return "\n".join(parts)
