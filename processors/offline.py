"""The offline backend: consolidation by deterministic rules, with no network and no API key.

It lets memoryd run end to end without an LLM (tests, demos, shadow replays) and makes a
replay byte-identical: the only clock is `request.now`, there is no randomness, and every
choice between equals is broken by a stable order.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, TypeVar

from domain.ids import normalize_content
from domain.model import Fact, FactStatus, FactType, SurfacePolicy, TokenUsage
from domain.ports import Embedder
from processors.heuristics import (
    SCAFFOLD_SLOT_KEYS,
    Similarity,
    Slot,
    approx_tokens,
    as_sentence,
    classify_slot,
    clip,
    first_sentences,
    is_fact_like,
    is_open_loop,
    to_third_person,
)
from processors.schema import (
    MAX_FACT_CHARS,
    MAX_FACTS_PER_RUN,
    MAX_SCAFFOLD_CHARS,
    MAX_WORKING_MEMORY_CHARS,
    MAX_WORKING_MEMORY_WORDS,
    BackendResponse,
    ConsolidationOutput,
    ConsolidationRequest,
    FactOp,
    FactProposal,
    Observation,
    scaffold_size,
)
from producers.contract import ContextEvent, EventType, Source

T = TypeVar("T")

TOOL_SUMMARY_CHARS = 300
LIST_CAP = 25
_LIST_CAPS: Final = {"Learned": 50}
# (confidence, salience): the user saying it beats the inbox inferring it beats a tool dump.
_WEIGHTS: Final = {
    Source.INTERACTIVE: (0.85, 0.7),
    Source.AUTONOMOUS: (0.7, 0.5),
    Source.TOOL: (0.6, 0.3),
}
_TOOL_SALIENCE: Final = _WEIGHTS[Source.TOOL][1]
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
_LIST_KEYS: Final = {
    EventType.FACT: "Profile",
    EventType.PREFERENCE: "Preferences",
    EventType.PROJECT_DETAILS: "Projects",
    EventType.LEARNED_FACT: "Learned",
}
# Only what the user said about themselves sets Role, Location…: the inbox's learned facts are
# as often about colleagues ("Lena's co-founder is…") as about the user.
_SLOT_KEY_KINDS: Final = frozenset({EventType.FACT, EventType.CORRECTION})
_LIST_SECTIONS: Final = (
    ("Current projects", "Projects", 5),
    ("Preferences", "Preferences", 6),
    ("Profile", "Profile", 6),
    ("Learned from the inbox", "Learned", 4),
)


class OfflineBackend:
    """A `ConsolidationBackend`; the embedder, when given, only sharpens similarity."""

    name = "offline"
    model = "offline-deterministic-v1"
    prompt_version = "offline-v1"

    def __init__(self, embedder: Embedder | None = None) -> None:
        self._embedder = embedder

    def consolidate(self, request: ConsolidationRequest) -> BackendResponse:
        plan = plan_facts(request, self._embedder)
        scaffold = build_scaffold(request.state.scaffold, plan.steps)
        output = ConsolidationOutput(
            updated_working_memory=build_working_memory(scaffold, plan, request),
            updated_scaffold=scaffold,
            facts=plan.proposals(),
        )
        raw = json.dumps(output.model_dump(mode="json"), sort_keys=True, ensure_ascii=False)
        usage = TokenUsage(approx_tokens(_prompt_text(request)), approx_tokens(raw))
        return BackendResponse(output=output, raw_response=raw, usage=usage, model=self.model)


@dataclass
class _Draft:
    """A proposal that later observations of the same batch may still merge into or drop."""

    proposal: FactProposal
    scope: str | None
    slot: Slot | None
    at: datetime
    alive: bool = True


@dataclass(frozen=True)
class Step:
    """What one observation means for the scaffold once duplicates and corrections are settled."""

    event: ContextEvent
    statement: str | None = None
    slot: Slot | None = None
    corrected: tuple[str, ...] = ()  # statements this one replaces


@dataclass
class Plan:
    steps: list[Step] = field(default_factory=list)
    drafts: list[_Draft] = field(default_factory=list)
    retired: set[str] = field(default_factory=set)  # ids of stored facts this batch contradicts

    def proposals(self) -> list[FactProposal]:
        """Live proposals in application order; over the cap, the least salient oldest go."""
        live = [d.proposal for d in self.drafts if d.alive]
        keep = sorted(range(len(live)), key=lambda i: (-live[i].salience, -i))[:MAX_FACTS_PER_RUN]
        return [live[i] for i in sorted(keep)]

    def live(self, scope: str | None) -> list[_Draft]:
        return [d for d in reversed(self.drafts) if d.alive and d.scope == scope]


def statement_for(event: ContextEvent) -> str | None:
    """The fact an event states, in the third person and capped; None if it states none."""
    if event.event_type not in _FACT_TYPES:
        return None
    if event.event_type is EventType.TOOL_OUTPUT:
        meta = event.source_metadata
        name = meta.filename or meta.attachment_id
        prefix = f"Attachment {clip(name, 80)}: " if name else ""
        # Tool text was written by someone else: its "I" is not the user, so no rewrite.
        summary = first_sentences(event.content, TOOL_SUMMARY_CHARS - len(prefix))
        return prefix + summary if is_fact_like(summary) else None
    text = clip(to_third_person(" ".join(event.content.split())), MAX_FACT_CHARS)
    return text if any(c.isalnum() for c in text) else None


def plan_facts(request: ConsolidationRequest, embedder: Embedder | None) -> Plan:
    statements = {o.label: statement_for(o.event) for o in request.observations}
    known = [f.content for f in request.active_facts]
    sim = Similarity(embedder, known + [s for s in statements.values() if s])
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
        is_correction = obs.event.event_type is EventType.CORRECTION
        if is_correction and _twin(plan, request, sim, statement, meta.connection_id) is None:
            plan.steps.append(_correct(plan, request, sim, obs, statement))
        else:
            plan.steps.append(_observe(plan, request, sim, obs, statement))
    return plan


# Held facts count: observing one again is what earns it a place (the ledger activates it).
_BELIEVED: Final = frozenset({FactStatus.ACTIVE, FactStatus.HELD})


def _believed(request: ConsolidationRequest, plan: Plan) -> list[Fact]:
    """Stored facts still believed after what this batch contradicted so far, newest first."""
    facts = [
        f
        for f in request.active_facts
        if f.status in _BELIEVED and str(f.fact_id) not in plan.retired
    ]
    return sorted(facts, key=lambda f: (f.updated_at, str(f.fact_id)), reverse=True)


def _in_scope(facts: Iterable[Fact], scope: str | None) -> list[Fact]:
    return [f for f in facts if f.provenance.connection_id == scope]


def _best(
    items: Sequence[T], text: str, content: Callable[[T], str], sim: Similarity, floor: float
) -> T | None:
    """The most similar item at or above `floor`; the first (newest) one wins a tie."""
    best, top = None, floor
    for item in items:
        score = sim.score(text, content(item))
        if score > top or (best is None and score >= top):
            best, top = item, score
    return best


def _twin(
    plan: Plan, request: ConsolidationRequest, sim: Similarity, statement: str, scope: str | None
) -> _Draft | Fact | None:
    draft = _best(plan.live(scope), statement, lambda d: d.proposal.content, sim, sim.duplicate)
    if draft is not None:
        return draft
    facts = _in_scope(_believed(request, plan), scope)
    return _best(facts, statement, lambda f: f.content, sim, sim.duplicate)


def _observe(
    plan: Plan, request: ConsolidationRequest, sim: Similarity, obs: Observation, statement: str
) -> Step:
    event, scope = obs.event, obs.event.source_metadata.connection_id
    slot = classify_slot(statement)
    twin = _twin(plan, request, sim, statement, scope)
    if isinstance(twin, _Draft):
        if len(twin.proposal.evidence) < 20:
            twin.proposal.evidence.append(obs.label)
        return Step(event, twin.proposal.content, slot)
    kind = _FACT_TYPES[event.event_type]
    if event.event_type is EventType.PROJECT_DETAILS and is_open_loop(statement):
        kind = FactType.OPEN_LOOP
    confidence, salience = _WEIGHTS[event.source_metadata.source]
    proposal = FactProposal(
        content=statement,
        type=kind,
        confidence=confidence,
        salience=round(salience + 0.1, 2) if kind is FactType.OPEN_LOOP else salience,
        surface=_SURFACES.get(kind, SurfacePolicy.SPEAK),
        evidence=[obs.label],
    )
    if twin is not None:
        proposal = proposal.model_copy(
            update={
                "op": FactOp.REINFORCE,
                "target_fact_id": str(twin.fact_id),
                "content": twin.content,
                "type": twin.fact_type,
                "surface": twin.surface,
            }
        )
    plan.drafts.append(_Draft(proposal, scope, slot, event.occurred_at))
    return Step(event, proposal.content, slot)


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
    plan: Plan, request: ConsolidationRequest, sim: Similarity, obs: Observation, statement: str
) -> Step:
    """Replace the statement a correction is about: same slot first, else the most similar."""
    event, scope = obs.event, obs.event.source_metadata.connection_id
    slot, drafts = classify_slot(statement), plan.live(scope)
    earlier = _slot_match(drafts, slot, lambda d: d.slot, lambda d: d.proposal.type) or _best(
        drafts, statement, lambda d: d.proposal.content, sim, sim.related
    )
    target_id, corrected, kind = None, [], FactType.PROFILE
    if earlier is not None:
        # The consolidator can only contradict stored facts: an in-batch one is just dropped.
        earlier.alive = False
        target_id, kind = earlier.proposal.target_fact_id, earlier.proposal.type
        corrected.append(earlier.proposal.content)
        slot = slot or earlier.slot
    if target_id is None:
        facts = [f for f in _in_scope(_believed(request, plan), scope) if not f.pinned]
        fact = _slot_match(
            facts, slot, lambda f: classify_slot(f.content), lambda f: f.fact_type
        ) or _best(facts, statement, lambda f: f.content, sim, sim.related)
        if fact is not None:
            target_id, kind = str(fact.fact_id), fact.fact_type
            corrected.append(fact.content)
            slot = slot or classify_slot(fact.content)
    if target_id is not None:
        plan.retired.add(target_id)
    proposal = FactProposal(
        op=FactOp.CONTRADICT if target_id else FactOp.ADD,
        content=statement,
        type=kind,
        confidence=0.95,
        salience=0.9,
        surface=_SURFACES.get(kind, SurfacePolicy.SPEAK),
        target_fact_id=target_id,
        evidence=[obs.label],
    )
    plan.drafts.append(_Draft(proposal, scope, slot, event.occurred_at))
    return Step(event, statement, slot, tuple(corrected))


# --- scaffold ---------------------------------------------------------------------------


def build_scaffold(current: Mapping[str, Any], steps: Iterable[Step]) -> dict[str, Any]:
    s: dict[str, Any] = copy.deepcopy(dict(current))
    for step in steps:
        event, kind = step.event, step.event.event_type
        scope = event.source_metadata.connection_id
        if kind is EventType.SCAFFOLD_UPDATE and event.scaffold_key is not None:
            s[event.scaffold_key] = _merge(s.get(event.scaffold_key), event.scaffold_value())
        elif kind is EventType.CONNECTION_UPDATE and scope is not None:
            _append(_connections(s), scope, clip(" ".join(event.content.split()), MAX_FACT_CHARS))
        elif step.statement is None or kind is EventType.TOOL_OUTPUT:
            continue
        elif scope is not None:
            # S is shown in every chat: what was said inside one connection stays under it.
            connections = _connections(s)
            for old in step.corrected:
                _forget(connections, old)
            _append(connections, scope, step.statement)
        else:
            homes = [_forget(s, old) for old in step.corrected]
            home = next((h for h in homes if h), None)
            _append(s, _LIST_KEYS.get(kind) or home or "Profile", step.statement)
            if step.slot in SCAFFOLD_SLOT_KEYS and kind in _SLOT_KEY_KINDS:
                s[SCAFFOLD_SLOT_KEYS[step.slot]] = step.statement
    return _bounded(_sorted(s))


def _norm(item: Any) -> str:
    text = item if isinstance(item, str) else json.dumps(item, sort_keys=True, default=str)
    return normalize_content(text)


def _append(container: dict[str, Any], key: str, text: str) -> None:
    """Add as the latest item; a repeat moves to the end instead of appearing twice."""
    value = container.get(key)
    items = value if isinstance(value, list) else [] if value is None else [value]
    items = [i for i in items if _norm(i) != _norm(text)] + [text]
    container[key] = items[-_LIST_CAPS.get(key, LIST_CAP) :]


def _forget(container: dict[str, Any], text: str) -> str | None:
    """Remove a statement that is no longer true; returns the list key it was kept under."""
    home = None
    for key in sorted(container, key=str):
        value = container[key]
        if isinstance(value, list):
            kept = [i for i in value if _norm(i) != _norm(text)]
            if len(kept) != len(value):
                container[key], home = kept, home or key
        elif isinstance(value, str) and _norm(value) == _norm(text):
            del container[key]
    return home


def _connections(s: dict[str, Any]) -> dict[str, Any]:
    value = s.get("Connections")
    if not isinstance(value, dict):
        value = {} if value is None else {"_previous": value}
        s["Connections"] = value
    return value


def _merge(old: Any, new: Any) -> Any:
    if isinstance(old, dict) and isinstance(new, dict):
        return {**old, **{k: _merge(old.get(k), v) for k, v in new.items()}}
    return new


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def _shrink(value: Any) -> bool:
    """Drop the oldest list item inside the largest branch; False if nothing is left to drop."""
    if isinstance(value, list) and value:
        value.pop(0)
        return True
    if isinstance(value, dict) and value:
        key = max(value, key=lambda k: (scaffold_size({str(k): value[k]}), str(k)))
        if not _shrink(value[key]):
            del value[key]
        return True
    return False


def _bounded(s: dict[str, Any]) -> dict[str, Any]:
    while s and scaffold_size(s) > MAX_SCAFFOLD_CHARS:
        _shrink(s)
    return s


# --- working memory ---------------------------------------------------------------------


def build_working_memory(
    scaffold: Mapping[str, Any], plan: Plan, request: ConsolidationRequest
) -> str:
    """A short narrative: who, what is due, what they work on, how they like things, news."""
    shown: set[str] = set()
    lines: list[str] = []

    def section(title: str, texts: Iterable[str], limit: int) -> None:
        fresh = [t for t in texts if isinstance(t, str) and t.strip() and _norm(t) not in shown]
        fresh = list(dict.fromkeys(fresh))[:limit]
        shown.update(_norm(t) for t in fresh)
        if fresh:
            lines.append(f"{title}: " + " ".join(as_sentence(t) for t in fresh))

    for key in ("Name", "Role", "Employer", "Location"):
        section(key, [scaffold.get(key, "")], 1)
    # W is shown in every chat: what was said inside one connection stays out of it.
    facts = [
        f
        for f in _believed(request, plan)
        if f.status is FactStatus.ACTIVE and f.provenance.connection_id is None
    ]
    rows = [(f.salience, f.updated_at, f.fact_type, f.content) for f in facts]
    rows += [
        (d.proposal.salience, d.at, d.proposal.type, d.proposal.content)
        for d in plan.drafts
        if d.alive and d.scope is None
    ]
    # Newest first within a salience; content breaks exact ties so the order never depends on
    # the input's.
    ranked = sorted(rows, key=lambda r: (-r[0], -r[1].timestamp(), r[3]))
    section("Open loops", [r[3] for r in ranked if r[2] is FactType.OPEN_LOOP], 5)
    for title, key, limit in _LIST_SECTIONS:
        value = scaffold.get(key)
        section(title, reversed(value) if isinstance(value, list) else [], limit)
    # Tool chunks are for retrieval, not for the narrative.
    section("Recent", [r[3] for r in ranked if (r[2], r[0]) != (FactType.LORE, _TOOL_SALIENCE)], 12)
    return _fit(lines, MAX_WORKING_MEMORY_WORDS, MAX_WORKING_MEMORY_CHARS)


def _fit(lines: Iterable[str], max_words: int, max_chars: int) -> str:
    """Join lines in priority order, cutting the first that does not fit, by words and chars."""
    parts: list[str] = []
    words = length = 0
    for line in lines:
        taken = line.split()[: max_words - words]
        text = " ".join(taken)
        room = max_chars - length - (1 if parts else 0)
        if len(text) > room:
            text = text[:room].rstrip()
        if text:
            parts.append(text)
            words, length = words + len(taken), length + len(text) + (1 if len(parts) > 1 else 0)
        if words >= max_words or length >= max_chars - 1:
            break
    return "\n".join(parts)


def _prompt_text(request: ConsolidationRequest) -> str:
    """What a prompt would carry, so offline runs cost something comparable to an LLM's."""
    scaffold = json.dumps(dict(request.state.scaffold), sort_keys=True, default=str)
    parts = [request.state.working_memory, scaffold]
    parts += [f.content for f in request.active_facts]
    parts += [o.event.content for o in request.observations]
    return "\n".join(parts)
