"""Maintenance rules: what time does to facts, and which duplicates a sweep merges.

Pure: facts, a clock value and a policy in, `FactChange`s out. The scheduled jobs (see
memoryd/ops/maintenance.py) apply them under the user's lock as one run each, written like a
consolidation run, so folding the run log reproduces them. Every rule moves a fact to a state
the rule no longer matches, which makes a second run over the same memory change nothing.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, time, timedelta
from enum import StrEnum
from typing import Any

import numpy as np

from domain.ids import maintenance_run_id_for
from domain.model import (
    Fact,
    FactChange,
    FactChangeKind,
    FactStatus,
    FactType,
    GateCounts,
    MemoryState,
    MemoryUpdate,
    RunRecord,
    RunStatus,
)
from domain.ports import Embedder
from processors.consolidate import applied_effect

RULES_VERSION = "maintenance/1"
MAINTENANCE_BACKEND = "maintenance"


class Rule(StrEnum):
    NEVER_RECALLED = "never_recalled"  # active, never recalled, old -> stale
    EPHEMERAL = "ephemeral"  # episodic, not reinforced for a while -> stale
    STALE_EXPIRED = "stale_expired"  # stale for long enough -> archived
    LOOP_PAST_DUE = "open_loop_past_due"  # an open loop whose date has passed -> closed
    LOOP_SILENT = "open_loop_silent"  # an open loop nobody mentioned or read -> closed
    DUPLICATE = "duplicate"  # superseded by a stronger near-identical fact
    ABSORBED = "absorbed"  # the stronger fact, taking over its duplicates' evidence


@dataclass(frozen=True)
class LifecyclePolicy:
    stale_after: timedelta = timedelta(days=180)
    archive_after: timedelta = timedelta(days=90)
    ephemeral_stale_after: timedelta = timedelta(days=14)
    open_loop_silent_after: timedelta = timedelta(days=60)
    open_loop_grace: timedelta = timedelta(days=1)


@dataclass(frozen=True)
class RuledChange:
    change: FactChange
    rule: Rule


# -- lifecycle --------------------------------------------------------------------------------


def _last_evidence(fact: Fact) -> datetime:
    return max(fact.created_at, fact.last_reinforced_at or fact.created_at)


def _last_activity(fact: Fact) -> datetime:
    return max(_last_evidence(fact), fact.last_recalled_at or fact.created_at)


def lifecycle_rule(fact: Fact, now: datetime, policy: LifecyclePolicy) -> Rule | None:
    """The rule that applies to `fact` at `now`, or None. Pinned facts are the user's word."""
    if fact.pinned:
        return None
    if fact.status is FactStatus.STALE:
        return Rule.STALE_EXPIRED if now - fact.updated_at >= policy.archive_after else None
    if fact.status is not FactStatus.ACTIVE:
        return None
    if fact.fact_type is FactType.OPEN_LOOP:
        due = due_date(fact.content, fact.created_at)
        # Not `due + grace`: a loop "until 9999-12-31" would overflow the calendar.
        if due is not None and now - policy.open_loop_grace >= due:
            return Rule.LOOP_PAST_DUE
        if now - _last_activity(fact) >= policy.open_loop_silent_after:
            return Rule.LOOP_SILENT
        return None
    age = now - _last_evidence(fact)
    if fact.fact_type is FactType.EPISODIC and age >= policy.ephemeral_stale_after:
        return Rule.EPHEMERAL
    if fact.recall_count == 0 and age >= policy.stale_after:
        return Rule.NEVER_RECALLED
    return None


RULE_OUTCOMES = {
    Rule.NEVER_RECALLED: (FactStatus.STALE, FactChangeKind.EXPIRE),
    Rule.EPHEMERAL: (FactStatus.STALE, FactChangeKind.EXPIRE),
    Rule.STALE_EXPIRED: (FactStatus.ARCHIVED, FactChangeKind.ARCHIVE),
    # Closing a loop archives it, as a backend's close_loop does (processors/lifecycle.py).
    Rule.LOOP_PAST_DUE: (FactStatus.ARCHIVED, FactChangeKind.CLOSE_LOOP),
    Rule.LOOP_SILENT: (FactStatus.ARCHIVED, FactChangeKind.CLOSE_LOOP),
}


def lifecycle_changes(
    facts: Sequence[Fact], now: datetime, policy: LifecyclePolicy
) -> list[RuledChange]:
    out = []
    for fact in facts:
        rule = lifecycle_rule(fact, now, policy)
        if rule is None:
            continue
        status, kind = RULE_OUTCOMES[rule]
        after = new_version(fact, now, status=status)
        out.append(RuledChange(FactChange(kind=kind, after=after, before=fact), rule))
    return out


def new_version(fact: Fact, now: datetime, **fields: Any) -> Fact:
    # A new version with a new status needs a new vector-index entry (the status is metadata).
    return replace(fact, **fields, updated_at=now, version=fact.version + 1, indexed_at=None)


# -- due dates of open loops ------------------------------------------------------------------

_MONTHS = {
    name: i
    for i, names in enumerate(
        (
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ),
        start=1,
    )
    for name in names
}
_MONTH = "|".join(sorted(_MONTHS, key=len, reverse=True))
_ISO_DATE = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
_MONTH_DAY = re.compile(
    rf"\b(?P<month>{_MONTH})\.?\s+(?P<day>\d{{1,2}})(?:st|nd|rd|th)?\b(?:,?\s+(?P<year>\d{{4}}))?",
    re.IGNORECASE | re.ASCII,  # Unicode folding matches "Aprıl" and "ſept": no such months
)
_DAY_MONTH = re.compile(
    rf"\b(?P<day>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?(?P<month>{_MONTH})\b(?:,?\s+(?P<year>\d{{4}}))?",
    re.IGNORECASE | re.ASCII,
)


def due_date(content: str, written_at: datetime) -> datetime | None:
    """The last calendar date an open loop names, as the end of that day in UTC.

    Only explicit dates count ("2026-12-15", "by December 15", "15 Dec 2026"); a date without
    a year is the next one on or after the day (in UTC) the fact was written. Weekdays and
    relative phrases ("next Friday") are left alone: a wrong guess would close a live loop.
    """
    # Postgres hands timestamps back in its session's TimeZone: read in that zone, the day
    # of writing and the end of the due day would move with the server's setting.
    written_at = written_at.astimezone(UTC)
    found: list[date] = []
    for m in _ISO_DATE.finditer(content):
        found.extend(_date(int(m[1]), int(m[2]), int(m[3])))
    for pattern in (_MONTH_DAY, _DAY_MONTH):
        for m in pattern.finditer(content):
            month = _MONTHS[m["month"].lower()]
            day = int(m["day"])
            if m["year"]:
                found.extend(_date(int(m["year"]), month, day))
                continue
            for candidate in _date(written_at.year, month, day):
                if candidate < written_at.date():
                    found.extend(_date(written_at.year + 1, month, day))
                else:
                    found.append(candidate)
    if not found:
        return None
    return datetime.combine(max(found), time.max, tzinfo=UTC)


def _date(year: int, month: int, day: int) -> list[date]:
    try:
        return [date(year, month, day)]
    except ValueError:  # "February 30": not a date, so no due date
        return []


# -- duplicate sweep --------------------------------------------------------------------------


@dataclass(frozen=True)
class DuplicatePolicy:
    threshold: float = 0.93  # cosine of the two contents' embeddings
    max_facts: int = 2_000  # per user and scope: the most recently changed ones


def strength(fact: Fact) -> tuple[Any, ...]:
    """Which of two duplicates survives: pinned, then surer, better evidenced, more used, older."""
    return (
        fact.pinned,
        round(fact.confidence, 4),
        fact.reinforce_count,
        fact.recall_count,
        round(fact.salience, 4),
        -fact.created_at.timestamp(),
        str(fact.fact_id),
    )


def duplicate_changes(
    facts: Sequence[Fact], now: datetime, embedder: Embedder, policy: DuplicatePolicy
) -> list[RuledChange]:
    """Merge active near-duplicates within one scope (a connection's facts never absorb
    global ones, nor the other way round): the weaker is archived with `superseded_by` the
    stronger, which takes over its evidence. Pinned facts are never superseded."""
    active = [f for f in facts if f.status is FactStatus.ACTIVE]
    scopes: dict[str | None, list[Fact]] = {}
    for fact in active:
        scopes.setdefault(fact.provenance.connection_id, []).append(fact)
    out: list[RuledChange] = []
    for members in scopes.values():
        recent = sorted(members, key=lambda f: (f.updated_at, str(f.fact_id)), reverse=True)
        out.extend(_merge_scope(recent[: policy.max_facts], now, embedder, policy.threshold))
    return out


def _merge_scope(
    facts: Sequence[Fact], now: datetime, embedder: Embedder, threshold: float
) -> list[RuledChange]:
    if len(facts) < 2:
        return []
    ordered = sorted(facts, key=strength, reverse=True)
    vectors = np.stack(embedder.embed([f.content for f in ordered]))
    similarity = vectors @ vectors.T
    absorbed: dict[int, int] = {}  # weaker index -> stronger index
    for i in range(len(ordered)):
        if i in absorbed:
            continue
        for j in range(i + 1, len(ordered)):
            if j not in absorbed and not ordered[j].pinned and similarity[i, j] >= threshold:
                absorbed[j] = i
    out: list[RuledChange] = []
    for i, fact in enumerate(ordered):
        weaker = [ordered[j] for j, k in absorbed.items() if k == i]
        if not weaker:
            continue
        for w in weaker:
            after = new_version(w, now, status=FactStatus.ARCHIVED, superseded_by=fact.fact_id)
            out.append(RuledChange(FactChange(FactChangeKind.MERGE, after, w), Rule.DUPLICATE))
        if not fact.pinned:  # a pinned row is never changed by a run, not even its evidence
            out.append(
                RuledChange(
                    FactChange(FactChangeKind.MERGE, absorbed_into(fact, weaker, now), fact),
                    Rule.ABSORBED,
                )
            )
    return out


def absorbed_into(stronger: Fact, weaker: Sequence[Fact], now: datetime) -> Fact:
    """Provenance kept: the evidence of every duplicate, and each counts as a reinforcement."""
    group = [stronger, *weaker]
    evidence = tuple(dict.fromkeys(e for f in group for e in f.provenance.source_event_ids))
    reinforced = [f.last_reinforced_at for f in group if f.last_reinforced_at is not None]
    return new_version(
        stronger,
        now,
        provenance=replace(stronger.provenance, source_event_ids=evidence),
        reinforce_count=stronger.reinforce_count + sum(w.reinforce_count + 1 for w in weaker),
        last_reinforced_at=max([*reinforced, max(w.created_at for w in weaker)]),
        confidence=max(f.confidence for f in group),
        salience=max(f.salience for f in group),
    )


# -- the run a maintenance job writes ---------------------------------------------------------


def maintenance_update(
    job: str,
    state: MemoryState,
    changes: Sequence[RuledChange],
    now: datetime,
    parameters: Mapping[str, Any],
) -> MemoryUpdate | None:
    """One run over one memory, written like a consolidation run (no events, no LLM), or None
    when nothing changes: a maintenance pass that changes nothing leaves no trace in memory."""
    if not changes:
        return None
    fact_changes = tuple(c.change for c in changes)
    new_state = replace(state, version=state.version + 1, updated_at=now)
    run = RunRecord(
        run_id=maintenance_run_id_for(job, state.organization_id, state.user_id, state.version),
        user_id=state.user_id,
        organization_id=state.organization_id,
        input_event_ids=(),
        backend=MAINTENANCE_BACKEND,
        model=job,
        prompt_version=RULES_VERSION,
        status=RunStatus.SUCCEEDED,
        started_at=now,
        duration_ms=0,
        base_version=state.version,
        output={
            "maintenance": {
                "job": job,
                "parameters": dict(parameters),
                "rules": [
                    {"fact_id": str(c.change.after.fact_id), "rule": c.rule.value} for c in changes
                ],
            },
            "applied": applied_effect(new_state, fact_changes, {}),
        },
        gate=GateCounts(),
    )
    return MemoryUpdate(run=run, state=new_state, fact_changes=fact_changes)


def rule_counts(changes: Sequence[RuledChange]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for c in changes:
        counts[c.rule.value] = counts.get(c.rule.value, 0) + 1
    return counts


Planner = Callable[[Sequence[Fact], datetime], list[RuledChange]]


def fact_ids(changes: Sequence[RuledChange]) -> list[uuid.UUID]:
    return [c.change.after.fact_id for c in changes]
