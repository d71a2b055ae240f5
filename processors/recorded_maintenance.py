"""A recorded maintenance run made again to another image of the memory (a shadow replay's).

A maintenance run consumes no event: what it did is only in the run log, as the rule each
fact met (`output.maintenance.rules`) and the facts it wrote. Its rules are not evaluated
again: they read what the run log does not hold (recall counters, which the read path writes
outside runs), so a second evaluation could decide otherwise. The decisions are made again
instead, to the facts the image holds in the state the rule left: on an image equal to the
live one at that point this is the live run itself.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from domain.codec import fact_from_json
from domain.model import (
    Fact,
    FactChange,
    FactChangeKind,
    FactStatus,
    MemoryState,
    MemoryUpdate,
    RunRecord,
    RunStatus,
)
from processors.maintenance import (
    MAINTENANCE_BACKEND,
    RULE_OUTCOMES,
    Rule,
    RuledChange,
    absorbed_into,
    maintenance_update,
    new_version,
)


def is_maintenance(run: RunRecord) -> bool:
    """A succeeded run of a maintenance job: it changed memory without any input event."""
    return (
        run.backend == MAINTENANCE_BACKEND
        and run.status is RunStatus.SUCCEEDED
        and isinstance((run.output or {}).get("maintenance"), Mapping)
    )


def recorded_changes(run: RunRecord, facts: Mapping[uuid.UUID, Fact]) -> list[RuledChange]:
    """The changes `run` decided, made to `facts`: a decision about a fact the image does not
    hold, or holds in a state the rule does not apply to (already stale, pinned), is left
    out, as the rule would leave it."""
    output = run.output or {}
    record = output["maintenance"]
    written = {
        after.fact_id: after
        for after in (fact_from_json(c["after"]) for c in output["applied"]["facts"])
    }
    now = run.started_at
    out: list[RuledChange] = []
    absorbed: dict[uuid.UUID, list[Fact]] = {}  # stronger -> its duplicates, as merged here
    for entry in record["rules"]:
        fact = facts.get(uuid.UUID(str(entry["fact_id"])))
        rule = Rule(entry["rule"])
        if fact is None or fact.pinned:
            continue
        expected = FactStatus.STALE if rule is Rule.STALE_EXPIRED else FactStatus.ACTIVE
        if fact.status is not expected:
            continue
        if rule in RULE_OUTCOMES:
            status, kind = RULE_OUTCOMES[rule]
            after = new_version(fact, now, status=status)
            out.append(RuledChange(FactChange(kind, after, fact), rule))
        elif rule is Rule.DUPLICATE:
            # The sweep lists a stronger fact after its duplicates: `absorbed` is complete
            # by the time its ABSORBED entry comes.
            live = written.get(fact.fact_id)
            stronger = None if live is None else live.superseded_by
            if stronger is None or stronger not in facts:
                continue
            after = new_version(fact, now, status=FactStatus.ARCHIVED, superseded_by=stronger)
            out.append(RuledChange(FactChange(FactChangeKind.MERGE, after, fact), rule))
            absorbed.setdefault(stronger, []).append(fact)
        elif rule is Rule.ABSORBED and absorbed.get(fact.fact_id):
            after = absorbed_into(fact, absorbed[fact.fact_id], now)
            out.append(RuledChange(FactChange(FactChangeKind.MERGE, after, fact), rule))
    return out


def recorded_update(
    run: RunRecord, state: MemoryState, facts: Mapping[uuid.UUID, Fact]
) -> MemoryUpdate | None:
    """`run` made again on (`state`, `facts`), as the job writes it; None if it changes
    nothing there."""
    record: Mapping[str, Any] = (run.output or {})["maintenance"]
    changes = recorded_changes(run, facts)
    at: datetime = run.started_at
    return maintenance_update(str(record["job"]), state, changes, at, record["parameters"])
