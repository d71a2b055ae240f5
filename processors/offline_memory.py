"""The offline backend's S and W: the scaffold built from a batch's steps, and the narrative.

Pure functions of the current memory and the batch's plan; every order is stable, so a replay
gives the same bytes.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

from domain.ids import normalize_content
from domain.model import FactStatus, FactType
from processors.heuristics import SCAFFOLD_SLOT_KEYS, as_sentence, clip
from processors.merge import MIN_NEW_WORDS, new_words
from processors.normalize import merge_json, truncate_at_sentence
from processors.plan import Plan, Step, believed
from processors.schema import (
    MAX_FACT_CHARS,
    MAX_SCAFFOLD_CHARS,
    MAX_WORKING_MEMORY_CHARS,
    MAX_WORKING_MEMORY_WORDS,
    ConsolidationRequest,
    scaffold_size,
)
from producers.contract import EventType

LIST_CAP = 25
PEOPLE_KEY = "People"
PERSON_CAP = 8
_LIST_CAPS: Final = {"Learned": 50}
_TOOL_SALIENCE: Final = 0.3
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
    ("How they like things: ", "Preferences", 6),
    ("About them: ", "Profile", 6),
    ("From the inbox: ", "Learned", 4),
)


def build_scaffold(current: Mapping[str, Any], steps: Iterable[Step]) -> dict[str, Any]:
    s: dict[str, Any] = copy.deepcopy(dict(current))
    for step in steps:
        event, kind = step.event, step.event.event_type
        scope = event.source_metadata.connection_id
        if kind is EventType.SCAFFOLD_UPDATE and event.scaffold_key is not None:
            s[event.scaffold_key] = merge_json(s.get(event.scaffold_key), event.scaffold_value())
        elif kind is EventType.CONNECTION_UPDATE and scope is not None:
            _append(_connections(s), scope, clip(" ".join(event.content.split()), MAX_FACT_CHARS))
        elif step.statement is None or kind is EventType.TOOL_OUTPUT:
            continue
        elif step.subject is not None:
            # A transcript's line is about its speaker: kept under their name, never as the
            # user's Role or Location.
            _append(_people(s), step.subject, step.statement, PERSON_CAP)
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
            # A slot key holds a statement about the user, not one that merely uses its words.
            about_user = "the user" in step.statement.casefold()
            if step.slot in SCAFFOLD_SLOT_KEYS and kind in _SLOT_KEY_KINDS and about_user:
                s[SCAFFOLD_SLOT_KEYS[step.slot]] = step.statement
    return _bounded(_sorted(s))


def _norm(item: Any) -> str:
    text = item if isinstance(item, str) else json.dumps(item, sort_keys=True, default=str)
    return normalize_content(text)


def _append(container: dict[str, Any], key: str, text: str, cap: int | None = None) -> None:
    """Add as the latest item; a repeat moves to the end instead of appearing twice."""
    value = container.get(key)
    items = value if isinstance(value, list) else [] if value is None else [value]
    items = [i for i in items if _norm(i) != _norm(text)] + [text]
    container[key] = items[-(cap or _LIST_CAPS.get(key, LIST_CAP)) :]


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


def _people(s: dict[str, Any]) -> dict[str, Any]:
    value = s.get(PEOPLE_KEY)
    if not isinstance(value, dict):
        value = {} if value is None else {"_previous": value}
        s[PEOPLE_KEY] = value
    return value


def _connections(s: dict[str, Any]) -> dict[str, Any]:
    value = s.get("Connections")
    if not isinstance(value, dict):
        value = {} if value is None else {"_previous": value}
        s["Connections"] = value
    return value


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
    """One narrative of the user's current context, most important first: who they are, what
    they work on and what is still open, what changed lately, then how they like things.

    Consistent: a statement is told once, even in other words in another section ("founder
    and CEO" after "founder and chief executive"), and only what is still believed is told.
    """
    shown: list[str] = []
    paragraphs: list[str] = []

    def tell(opening: str, texts: Iterable[str], limit: int) -> None:
        fresh: list[str] = []
        for text in texts:
            if len(fresh) == limit:
                break
            if isinstance(text, str) and text.strip() and not _told(text, shown):
                fresh.append(text)
                shown.append(text)
        if fresh:
            paragraphs.append(opening + " ".join(as_sentence(t) for t in fresh))

    tell("", [scaffold.get(key, "") for key in ("Name", "Role", "Employer", "Location")], 4)
    # W is shown in every chat: what was said inside one connection stays out of it.
    facts = [
        f
        for f in believed(request, plan)
        if f.status is FactStatus.ACTIVE and f.provenance.connection_id is None
    ]
    rows = [(f.salience, f.observed_at or f.updated_at, f.fact_type, f.content) for f in facts]
    rows += [
        (d.proposal.salience, d.at, d.proposal.type, d.proposal.content)
        for d in plan.drafts
        if d.alive and d.scope is None
    ]
    # Content breaks exact ties so the order never depends on the input's.
    ranked = sorted(rows, key=lambda r: (-r[0], -r[1].timestamp(), r[3]))
    newest = sorted(rows, key=lambda r: (-r[1].timestamp(), -r[0], r[3]))
    tell("Working on: ", _latest(scaffold, "Projects"), 5)
    tell("Still open: ", [r[3] for r in ranked if r[2] is FactType.OPEN_LOOP], 5)
    # Tool chunks are for retrieval, not for the narrative.
    tell(
        "Lately: ",
        [r[3] for r in newest if (r[2], r[0]) != (FactType.LORE, _TOOL_SALIENCE)],
        6,
    )
    for opening, key, limit in _LIST_SECTIONS:
        tell(opening, _latest(scaffold, key), limit)
    if not paragraphs:
        # Nothing to tell from what is believed now: W told drafts the write gate then
        # discarded (too short to be a fact), or facts of one connection came since. An
        # empty W over a told one is refused as a wipe (`wiping_answer`), and the batch's
        # events would be dead-lettered for it: W stays as it was.
        return request.state.working_memory
    return _fit(paragraphs, MAX_WORKING_MEMORY_WORDS, MAX_WORKING_MEMORY_CHARS)


def _latest(scaffold: Mapping[str, Any], key: str) -> list[str]:
    value = scaffold.get(key)
    return list(reversed(value)) if isinstance(value, list) else []


def _told(text: str, shown: Iterable[str]) -> bool:
    """Already said, in these or other words: it adds fewer than two words to a told one."""
    return any(len(new_words(old, text)) < MIN_NEW_WORDS for old in shown)


def _fit(lines: Iterable[str], max_words: int, max_chars: int) -> str:
    """Join lines in priority order, cutting the first that does not fit, by words and chars,
    after its last whole sentence that fits (else after its last whole word)."""
    parts: list[str] = []
    words = length = 0
    for line in lines:
        room = max_chars - length - (1 if parts else 0)
        text = truncate_at_sentence(" ".join(line.split()), room, max_words - words)
        if text:
            parts.append(text)
            words += len(text.split())
            length += len(text) + (1 if len(parts) > 1 else 0)
        if text != " ".join(line.split()) or words >= max_words or length >= max_chars - 1:
            break
    return "\n".join(parts)
