"""Memory rebuilt from the run log: a fold, pure and deterministic (no LLM, no database).

Every succeeded run records its `applied` effect (W, S, learned info, connection info and the
full new state of each changed fact). Folding those effects in log order, with the store's own
rule for writing a fact over a stored one (`domain.upsert.merge_fact`), gives what the live
tables hold, or held at any earlier time (`runs_until`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from itertools import takewhile
from typing import Any

from domain.codec import fact_from_json, fact_to_json
from domain.model import (
    MAX_LEARNED_INFO,
    ConnectionContext,
    Fact,
    FactStatus,
    LoggedRun,
    MemoryState,
    RunRecord,
    RunStatus,
)
from domain.upsert import merge_fact
from processors.errors import ProcessorError


class FoldError(ProcessorError):
    """The run log cannot be folded: out of order, a version gap, or no recorded effect."""


@dataclass(frozen=True)
class FoldedMemory:
    """One memory's image (an organization's user): folded from runs, or read from the live
    tables."""

    user_id: str
    organization_id: str = ""
    working_memory: str = ""
    scaffold: Mapping[str, Any] = field(default_factory=dict)
    learned_info: tuple[str, ...] = ()
    version: int = 0
    updated_at: datetime | None = None
    connections: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    facts: Mapping[uuid.UUID, Fact] = field(default_factory=dict)
    last_seq: int = 0
    runs_folded: int = 0

    def state(self) -> MemoryState:
        return MemoryState(
            user_id=self.user_id,
            organization_id=self.organization_id,
            working_memory=self.working_memory,
            scaffold=dict(self.scaffold),
            learned_info=self.learned_info,
            version=self.version,
            updated_at=self.updated_at,
        )

    def facts_in(self, statuses: Sequence[FactStatus] = tuple(FactStatus)) -> tuple[Fact, ...]:
        """In the order the memory store lists them: created_at, then fact id."""
        wanted = frozenset(statuses)
        chosen = [f for f in self.facts.values() if f.status in wanted]
        return tuple(sorted(chosen, key=lambda f: (f.created_at, f.fact_id)))

    def to_json(self) -> dict[str, Any]:
        return {
            "user_id": self.user_id,
            "organization_id": self.organization_id,
            "version": self.version,
            "updated_at": None if self.updated_at is None else self.updated_at.isoformat(),
            "runs_folded": self.runs_folded,
            "working_memory": self.working_memory,
            "scaffold": dict(self.scaffold),
            "learned_info": list(self.learned_info),
            "connections": {k: list(v) for k, v in sorted(self.connections.items())},
            "facts": [fact_to_json(f) for f in self.facts_in()],
        }


def live_image(
    state: MemoryState, facts: Iterable[Fact], connections: Iterable[ConnectionContext]
) -> FoldedMemory:
    """The live tables as a `FoldedMemory`, so that live and folded images diff field by field."""
    return FoldedMemory(
        user_id=state.user_id,
        organization_id=state.organization_id,
        working_memory=state.working_memory,
        scaffold=dict(state.scaffold),
        learned_info=tuple(state.learned_info),
        version=state.version,
        updated_at=state.updated_at,
        connections={c.connection_id: tuple(c.learned_info) for c in connections},
        facts={f.fact_id: f for f in facts},
    )


def fold_runs(runs: Iterable[LoggedRun], start: FoldedMemory | None = None) -> FoldedMemory:
    """Fold succeeded runs, in log order, onto `start` (an empty memory by default).

    Failed and deferred runs changed nothing and are skipped. Raises FoldError when the log
    is out of order, mixes users, or has a succeeded run that does not continue the version
    the fold has reached (a gap: some run is missing).
    """
    memory = start
    for logged in runs:
        if memory is None:
            memory = FoldedMemory(
                user_id=logged.run.user_id, organization_id=logged.run.organization_id
            )
        memory = fold_run(memory, logged)
    if memory is None:
        raise FoldError("nothing to fold: no runs and no start memory")
    return memory


def fold_run(memory: FoldedMemory, logged: LoggedRun) -> FoldedMemory:
    """One run folded onto memory (see `fold_runs`)."""
    run = logged.run
    if logged.seq <= memory.last_seq:
        raise FoldError(f"run {run.run_id}: seq {logged.seq} after seq {memory.last_seq}")
    if run.user_id != memory.user_id or (
        memory.organization_id and run.organization_id != memory.organization_id
    ):
        raise FoldError(
            f"run {run.run_id} is of {run.organization_id}/{run.user_id},"
            f" not {memory.organization_id}/{memory.user_id}"
        )
    if run.status is not RunStatus.SUCCEEDED:
        return replace(memory, last_seq=logged.seq)
    if run.base_version != memory.version:
        raise FoldError(
            f"run {run.run_id} (seq {logged.seq}) was planned on version {run.base_version},"
            f" the fold is at version {memory.version}: a run is missing from the log"
        )
    applied = (run.output or {}).get("applied")
    if not isinstance(applied, Mapping):
        raise FoldError(f"run {run.run_id} (seq {logged.seq}) records no applied effect")
    try:
        return _apply(memory, run, logged.seq, applied)
    except (KeyError, TypeError, ValueError) as e:
        raise FoldError(f"run {run.run_id}: malformed applied effect: {e!r}") from e


def _apply(
    memory: FoldedMemory, run: RunRecord, seq: int, applied: Mapping[str, Any]
) -> FoldedMemory:
    facts = dict(memory.facts)
    written = [fact_from_json(change["after"]) for change in applied["facts"]]
    for after in written:
        facts[after.fact_id] = merge_fact(facts.get(after.fact_id), after)
    # A successor the image never holds was erased: its entries left the log, and the live
    # erasure cleared the pointers to it (erase_fact), so the fold clears them too. A pointer
    # is only set by a run's write, and the image never loses a fact: checking the run's
    # writes is enough.
    for fact_id in {after.fact_id for after in written}:
        fact = facts[fact_id]
        if fact.superseded_by is not None and fact.superseded_by not in facts:
            facts[fact_id] = replace(fact, superseded_by=None)
    connections = dict(memory.connections)
    for connection_id, additions in applied.get("connection_additions", {}).items():
        # Cut as the store cuts it (store.write.run_rows), so live and folded images agree.
        kept = (*connections.get(connection_id, ()), *additions)
        connections[connection_id] = kept[-MAX_LEARNED_INFO:]
    return FoldedMemory(
        user_id=memory.user_id,
        organization_id=run.organization_id,
        working_memory=str(applied["working_memory"]),
        scaffold=dict(applied["scaffold"]),
        learned_info=tuple(applied["learned_info"]),
        version=int(applied["version"]),
        updated_at=run.started_at,
        connections=connections,
        facts=facts,
        last_seq=seq,
        runs_folded=memory.runs_folded + 1,
    )


def runs_until(runs: Iterable[LoggedRun], at: datetime) -> Iterator[LoggedRun]:
    """The runs committed at or before `at`: the log's prefix up to the first later one, taken
    as `runs` yields them and read no further (a log can be long).

    `finished_at` is when the run's record was written, the last write of its transaction
    (migration 0017), and one user's runs are serialized by the memory lock, so a prefix is
    what memory was at `at`. A run whose COMMIT was under way at `at` counts as committed: the
    commit's own round trip is the only time by which the two can differ.
    """
    return takewhile(lambda logged: logged.finished_at <= at, runs)
