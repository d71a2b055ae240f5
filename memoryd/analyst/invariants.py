"""The pipeline's promises, checked by counting: nothing lost, nothing doubled.

Given the events a test or a load run produced (their ids, per memory) and the records on the
dead-letter topic, `check_invariants` reads Postgres and counts every way the promise of the
README can break:

- an event produced but not in the log, or in it twice, or in it without being produced;
- a logged event neither consolidated nor dead-lettered (lost between log and memory), or
  consolidated by more than one succeeded run, or marked consumed by no run in the log;
- a fact, run, ledger entry or dead letter written twice;
- a memory whose live state is not the fold of its runs (`memoryd replay verify`).

Every count is a number a test compares with zero, so a failure says how much broke, and
`details` names a few of the culprits. Ids are deterministic (`domain.ids`), so most doubles
are made impossible by unique keys; these checks look for doubles the keys cannot see (the
same content under two fact ids, the same events in two runs, the same letter sent twice).
"""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from psycopg_pool import ConnectionPool

from domain.ids import MemoryKey, normalize_content
from domain.model import FactStatus, RunStatus
from memoryd.analyst.dead_letters import SeenLetter, read_dead_letters
from memoryd.analyst.verify import verify_memory
from memoryd.settings import Settings
from processors.fold import live_image
from store.postgres import make_pool, snapshot, transaction
from store.write.flush_sql import REDACTED_CONTENT
from store.write.memory_store import PostgresMemoryStore
from store.write.run_log import PostgresRunLog, read_only_dsn

# How many culprits `details` keeps per invariant: enough to start looking, bounded for a
# load run where a bug breaks thousands.
MAX_DETAILS = 10


@dataclass(frozen=True)
class InvariantReport:
    """Totals (for context) and violations (each must be 0) of one check."""

    # totals
    expected: int = 0
    logged: int = 0
    consolidated: int = 0
    dead_lettered: int = 0
    memories: int = 0
    # violations
    missing_from_log: int = 0
    doubled_in_log: int = 0
    unexpected_in_log: int = 0
    unaccounted: int = 0
    consolidated_twice: int = 0
    consolidated_without_run: int = 0
    doubled_facts: int = 0
    doubled_runs: int = 0
    doubled_ledger: int = 0
    doubled_dead_letters: int = 0
    letters_without_reason: int = 0
    diverged_memories: int = 0
    details: Mapping[str, Sequence[str]] = field(default_factory=dict, compare=False)

    TOTALS = frozenset({"expected", "logged", "consolidated", "dead_lettered", "memories"})

    def violations(self) -> dict[str, int]:
        """The invariants that do not hold, with how often each is broken."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in self.TOTALS and f.name != "details" and getattr(self, f.name)
        }

    @property
    def ok(self) -> bool:
        return not self.violations()

    def summary(self) -> str:
        head = (
            f"{self.expected} expected, {self.logged} logged, {self.consolidated} consolidated,"
            f" {self.dead_lettered} dead-lettered, {self.memories} memories"
        )
        broken = self.violations()
        if not broken:
            return f"{head}: all invariants hold"
        lines = [f"{head}: {len(broken)} invariant(s) broken"]
        for name, count in broken.items():
            shown = ", ".join(self.details.get(name, ()))
            lines.append(f"  {name}: {count}" + (f" ({shown})" if shown else ""))
        return "\n".join(lines)


EventRef = tuple[MemoryKey, uuid.UUID]


class _Findings:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.details: dict[str, list[str]] = defaultdict(list)

    def add(self, name: str, culprits: Iterable[object], extra: int | None = None) -> None:
        """Count `culprits` (or `extra` for each one's surplus, when given) under `name`."""
        items = list(culprits)
        self.counts[name] = self.counts.get(name, 0) + (len(items) if extra is None else extra)
        shown = self.details[name]
        shown.extend(_show(c) for c in items[: MAX_DETAILS - len(shown)])


def _show(culprit: object) -> str:
    if isinstance(culprit, tuple) and len(culprit) == 2 and isinstance(culprit[0], MemoryKey):
        return f"{culprit[0]}:{culprit[1]}"
    return str(culprit)


def check_invariants(
    pool: ConnectionPool,
    expected: Mapping[MemoryKey, Collection[uuid.UUID]],
    letters: Sequence[SeenLetter] = (),
) -> InvariantReport:
    """Count what breaks the promises, for the events in `expected` and all of the database.

    `expected` holds the valid events produced (invalid records are not events: they show up
    only as letters). `letters` is the dead-letter topic read from its beginning.
    """
    found = _Findings()
    wanted = {(k, e) for k, ids in expected.items() for e in ids}
    logged = _log_counts(pool)
    found.add("missing_from_log", sorted(wanted - logged.keys(), key=str))
    doubled = {ref: n - 1 for ref, n in logged.items() if n > 1}
    found.add("doubled_in_log", doubled, sum(doubled.values()))
    found.add("unexpected_in_log", sorted(logged.keys() - wanted, key=str))

    lettered = {(ltr.key, ltr.event_id) for ltr in letters if ltr.key and ltr.event_id}
    runs = _runs(pool)
    consumed = _consumed(pool)
    succeeded_in = Counter(
        (r.key, e) for r in runs if r.status == RunStatus.SUCCEEDED for e in r.input_event_ids
    )
    erased = _erased_in_log(pool)  # a flush drops the consumer's copy of these
    found.add(
        "unaccounted",
        sorted(
            ref
            for ref in logged
            if ref not in consumed and ref not in lettered and ref not in erased
        ),
    )
    twice = {ref: n - 1 for ref, n in succeeded_in.items() if n > 1}
    found.add("consolidated_twice", twice, sum(twice.values()))
    run_of = {r.run_id: r for r in runs}
    found.add(
        "consolidated_without_run",
        sorted(
            ref
            for ref, run_id in consumed.items()
            if run_id not in run_of or ref[1] not in run_of[run_id].input_event_ids
        ),
    )
    _count_doubled_runs(found, runs)
    _count_doubled_facts(found, pool)
    _count_doubled_ledger(found, pool)
    _count_letters(found, letters)

    keys = set(expected) | {r.key for r in runs}
    diverged = _diverged(pool, keys)
    found.add("diverged_memories", diverged)
    return InvariantReport(
        expected=len(wanted),
        logged=sum(logged.values()),
        consolidated=len(consumed),
        dead_lettered=len(letters),
        memories=len(keys),
        details={k: tuple(v) for k, v in found.details.items() if v},
        **found.counts,
    )


def check_deployment(
    settings: Settings, expected: Mapping[MemoryKey, Collection[uuid.UUID]]
) -> InvariantReport:
    """`check_invariants` on a deployment: its database and its whole dead-letter topic.

    Read only, like every analyst command: a bug in a check cannot change the deployment."""
    k = settings.kafka
    letters = read_dead_letters(k.bootstrap_servers, k.dead_letter_topic)
    pool = make_pool(read_only_dsn(settings.postgres.dsn), max_size=2, name="memoryd-invariants")
    try:
        return check_invariants(pool, expected, letters)
    finally:
        pool.close()


# -- reading ----------------------------------------------------------------------------------


def _fetch(pool: ConnectionPool, sql: str) -> list[tuple[Any, ...]]:
    with transaction(pool, "invariant check") as conn:
        return conn.execute(sql).fetchall()


def _log_counts(pool: ConnectionPool) -> dict[EventRef, int]:
    rows = _fetch(
        pool,
        "SELECT organization_id, user_id, event_id, count(*) FROM context_events"
        " GROUP BY organization_id, user_id, event_id",
    )
    return {(MemoryKey(o, u), e): n for o, u, e, n in rows}


def _erased_in_log(pool: ConnectionPool) -> set[EventRef]:
    """Events a fact erasure redacted in the log (consumers.forgetting)."""
    rows = _fetch(
        pool,
        f"SELECT organization_id, user_id, event_id FROM context_events WHERE {REDACTED_CONTENT}",
    )
    return {(MemoryKey(o, u), e) for o, u, e in rows}


def _consumed(pool: ConnectionPool) -> dict[EventRef, uuid.UUID]:
    rows = _fetch(
        pool, "SELECT organization_id, user_id, event_id, run_id FROM consolidated_events"
    )
    return {(MemoryKey(o, u), e): r for o, u, e, r in rows}


@dataclass(frozen=True)
class _Run:
    run_id: uuid.UUID
    key: MemoryKey
    status: str
    attempt: int
    input_event_ids: frozenset[uuid.UUID]


def _runs(pool: ConnectionPool) -> list[_Run]:
    rows = _fetch(
        pool,
        "SELECT run_id, organization_id, user_id, status, attempt, input_event_ids"
        " FROM consolidation_runs ORDER BY seq",
    )
    return [_Run(r, MemoryKey(o, u), s, a, frozenset(ids)) for r, o, u, s, a, ids in rows]


# -- doubles ----------------------------------------------------------------------------------


def _surplus(counter: Counter[Any]) -> dict[Any, int]:
    return {k: n - 1 for k, n in counter.items() if n > 1}


def _count_doubled_runs(found: _Findings, runs: Sequence[_Run]) -> None:
    # The same events applied twice under two ids. A failed or deferred run may repeat: a
    # redriven event that fails again is a new occurrence with a record of its own.
    same = _surplus(
        Counter(
            (r.key, tuple(sorted(map(str, r.input_event_ids))), r.attempt)
            for r in runs
            if r.input_event_ids and r.status == RunStatus.SUCCEEDED
        )
    )
    found.add("doubled_runs", [f"{k[0]} {len(k[1])} event(s)" for k in same], sum(same.values()))


def _count_doubled_facts(found: _Findings, pool: ConnectionPool) -> None:
    # Two live facts saying the same thing in the same scope; superseded ones are history.
    rows = _fetch(
        pool,
        "SELECT organization_id, user_id, coalesce(connection_id, ''), content FROM memory_facts"
        f" WHERE superseded_by IS NULL AND status <> '{FactStatus.ARCHIVED.value}'",
    )
    same = _surplus(Counter((MemoryKey(o, u), c, normalize_content(t)) for o, u, c, t in rows))
    found.add("doubled_facts", [f"{k[0]}:{k[2][:40]!r}" for k in same], sum(same.values()))


def _count_doubled_ledger(found: _Findings, pool: ConnectionPool) -> None:
    # One LLM charge per run.
    rows = _fetch(
        pool,
        "SELECT run_id, operation, count(*) FROM credit_ledger"
        " WHERE run_id IS NOT NULL AND operation = 'llm' GROUP BY 1, 2 HAVING count(*) > 1",
    )
    found.add("doubled_ledger", [f"run {r[0]} {r[1]}" for r in rows], sum(r[2] - 1 for r in rows))
    # Each fact version is embedded and charged once: a fact a later run changes is indexed
    # (and booked under the run that created it) again, so two entries of a run are no double,
    # but a memory's embedding units above the versions its facts went through are. Those
    # include what a fact erasure counted in `erased_fact_versions`: the erased fact's, and
    # the redacted text of the facts quoting it, embedded again at the same version.
    rows = _fetch(
        pool,
        "WITH units AS (SELECT organization_id, user_id, sum(units) AS n FROM credit_ledger"
        "  WHERE operation = 'embedding' AND run_id IS NOT NULL GROUP BY 1, 2),"
        " versions AS (SELECT organization_id, user_id, sum(n) AS n FROM ("
        "  SELECT organization_id, user_id, version AS n FROM memory_facts"
        "  UNION ALL SELECT organization_id, user_id, erased_fact_versions FROM user_memory"
        "  ) AS v GROUP BY 1, 2)"
        " SELECT organization_id, user_id, units.n - versions.n"
        " FROM units JOIN versions USING (organization_id, user_id) WHERE units.n > versions.n",
    )
    found.add(
        "doubled_ledger",
        [f"{MemoryKey(r[0], r[1])} embedding" for r in rows],
        sum(int(r[2]) for r in rows),
    )


def _count_letters(found: _Findings, letters: Sequence[SeenLetter]) -> None:
    # One consumer gives up on one record once; the log writer and the processor each
    # dead-letter an undecodable record, which is one letter per consumer, not a double.
    same = _surplus(Counter((ltr.consumer, ltr.stage, ltr.source) for ltr in letters))
    found.add(
        "doubled_dead_letters",
        [f"{c}/{s} {t}:{p}@{o}" for c, s, (t, p, o) in same],
        sum(same.values()),
    )
    found.add(
        "letters_without_reason",
        [f"{ltr.consumer}/{ltr.stage} {ltr.source}" for ltr in letters if not ltr.reason.strip()],
    )


def _diverged(pool: ConnectionPool, keys: Iterable[MemoryKey]) -> list[str]:
    out = []
    for key in sorted(keys):
        with snapshot(pool) as snap:  # as `memoryd replay verify` reads a memory
            memory, run_log = PostgresMemoryStore(snap), PostgresRunLog(snap)
            state, facts = memory.load_state(key), memory.facts(key, tuple(FactStatus))
            live = live_image(state, facts, run_log.connections(key))
            v = verify_memory(key, list(run_log.iter_runs(key)), live)
        if not v.ok:
            out.append(f"{key}: {v.error or 'live memory is not the fold of its runs'}")
    return out
