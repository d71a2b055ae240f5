"""The maintenance jobs: lifecycle, duplicate sweep, retention of read audit rows, and the
vector index checked against Postgres (`consumers.index_check`, repaired where it differs).

Each memory is changed under the user's advisory lock (the one flushes take), by one run
written like a consolidation run (processors.maintenance.maintenance_update), so the fold of
the run log reproduces it; each job execution is also recorded in `maintenance_runs`. The
rules move every fact they touch out of their own reach, so a second run changes nothing.
A memory the store refuses to change is logged and left for the next run; an outage stops
the run.
Scheduled once per cluster (store.write.cluster_jobs); `memoryd maintenance run` runs them by
hand under the same locks.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from domain.ids import MemoryKey
from domain.model import Fact, FactStatus
from memoryd.ops.config import MaintenanceSettings
from memoryd.ops.metrics import MaintenanceMetrics
from memoryd.wiring import Core, index_checker
from processors.maintenance import (
    DuplicatePolicy,
    LifecyclePolicy,
    RuledChange,
    duplicate_changes,
    lifecycle_changes,
    maintenance_update,
    rule_counts,
)
from store.errors import (
    DatabaseUnavailable,
    EmbeddingModelError,
    JobFenced,
    StoreError,
    VectorIndexUnavailable,
)
from store.write.maintenance_queries import MaintenanceQueries, MaintenanceRunRow

log = logging.getLogger(__name__)
JOBS = ("lifecycle", "dedupe", "retention", "index")
INDEX_RULES = ("vectors_absent", "vectors_differing", "vectors_orphaned")
# A dependency away or unusable, or the run superseded by another (its lock lost), not
# something about one memory: every memory after it would fail alike, so the run stops.
ABORTS_A_RUN = (DatabaseUnavailable, VectorIndexUnavailable, EmbeddingModelError, JobFenced)


@dataclass(frozen=True)
class JobReport:
    job: str
    run_id: uuid.UUID
    users: int = 0
    changes: dict[str, int] = field(default_factory=dict)
    skipped: int = 0  # memories left for the next run

    @property
    def changed(self) -> int:
        return sum(self.changes.values())


def lifecycle_policy(s: MaintenanceSettings) -> LifecyclePolicy:
    return LifecyclePolicy(
        stale_after=timedelta(days=s.stale_after_days),
        archive_after=timedelta(days=s.archive_after_days),
        ephemeral_stale_after=timedelta(days=s.ephemeral_stale_after_days),
        open_loop_silent_after=timedelta(days=s.open_loop_silent_days),
        open_loop_grace=timedelta(days=s.open_loop_grace_days),
    )


Plan = Callable[[Sequence[Fact]], list[RuledChange]]


@dataclass
class Tally:
    """What a run has done so far, kept as it goes: a run that fails midway has committed
    the memories it changed before, and its record says so."""

    users: int = 0
    changes: dict[str, int] = field(default_factory=dict)
    skipped: int = 0  # memories left for the next run

    def add(self, counts: dict[str, int]) -> None:
        for rule, n in counts.items():
            if n:
                self.changes[rule] = self.changes.get(rule, 0) + n


class MaintenanceRunner:
    def __init__(
        self,
        core: Core,
        settings: MaintenanceSettings,
        metrics: MaintenanceMetrics | None = None,
        queries: MaintenanceQueries | None = None,
    ) -> None:
        self._core = core
        self._settings = settings
        self._metrics = metrics
        self._queries = MaintenanceQueries(core.pool) if queries is None else queries
        if metrics is not None:
            # At 0 from the start: an alert on their increase misses a series born at n.
            for rule in INDEX_RULES:
                metrics.changes.labels("index", rule)

    def run(self, job: str) -> JobReport:
        if job not in JOBS:
            raise ValueError(f"unknown maintenance job {job!r}; one of {', '.join(JOBS)}")
        now = self._core.clock()
        run_id = uuid.uuid4()  # one execution, whatever it finds
        parameters = self._settings.model_dump(mode="json")
        done = Tally()

        def row(outcome: str, error: str | None = None) -> MaintenanceRunRow:
            return MaintenanceRunRow(
                run_id,
                job,
                now,
                outcome,
                done.users,
                dict(done.changes),
                parameters,
                error,
                done.skipped,
            )

        try:
            getattr(self, f"_{job}")(now, done)
        except JobFenced:
            # Its record would be refused as well: the run that superseded it is the one that
            # records (the memories this one changed have their own runs, backend maintenance).
            raise
        except StoreError as e:
            self._record(row("failed", str(e)))
            raise
        report = JobReport(job, run_id, done.users, done.changes, done.skipped)
        self._record(row("succeeded"))
        log.info(
            "maintenance %s changed %d item(s) in %d memories, left %d for the next run",
            job,
            report.changed,
            done.users,
            done.skipped,
            extra={"run_id": str(run_id), "cluster_job": job},
        )
        return report

    def _record(self, row: MaintenanceRunRow) -> None:
        self._queries.record_run(row)
        if self._metrics is not None:
            self._metrics.runs.labels(row.job, row.outcome).inc()
            for rule, n in row.changes.items():
                self._metrics.changes.labels(row.job, rule).inc(n)

    # -- the jobs -------------------------------------------------------------------------

    def _lifecycle(self, now: datetime, done: Tally) -> None:
        policy = lifecycle_policy(self._settings)
        keys = self._queries.lifecycle_candidates(
            active_before=now - min(policy.stale_after, policy.ephemeral_stale_after),
            stale_before=now - policy.archive_after,
        )
        self._per_memory(
            "lifecycle",
            keys,
            (FactStatus.ACTIVE, FactStatus.STALE),
            lambda facts: lifecycle_changes(facts, now, policy),
            now,
            done,
        )

    def _dedupe(self, now: datetime, done: Tally) -> None:
        s = self._settings
        policy = DuplicatePolicy(threshold=s.duplicate_threshold, max_facts=s.duplicate_max_facts)
        # Since the last run that left no memory alone: one it left may have changed before.
        keys = self._queries.duplicate_candidates(self._queries.last_complete("dedupe"))
        embedder = self._core.embedder
        self._per_memory(
            "dedupe",
            keys,
            (FactStatus.ACTIVE,),
            lambda facts: duplicate_changes(facts, now, embedder, policy),
            now,
            done,
        )

    def _retention(self, now: datetime, done: Tally) -> None:
        before = now - timedelta(days=self._settings.context_log_retention_days)
        # Counted batch by batch: those committed before a failure stay deleted.
        for deleted in self._queries.delete_context_logs(before):
            if self._metrics is not None:
                self._metrics.context_logs_deleted.inc(deleted)
            done.add({"context_logs_deleted": deleted})

    def _index(self, _now: datetime, done: Tally) -> None:
        # Counted as what it found, which is what an operator wants to hear of: Chroma lost
        # vectors or holds erased ones (the MemorydIndexRepaired alert).
        found = index_checker(self._core).check(repair=True)
        done.add(
            dict(zip(INDEX_RULES, (found.absent, found.differing, found.orphans), strict=True))
        )

    def _per_memory(
        self,
        job: str,
        keys: Sequence[MemoryKey],
        statuses: Sequence[FactStatus],
        plan: Plan,
        now: datetime,
        done: Tally,
    ) -> None:
        parameters: dict[str, Any] = self._settings.model_dump(mode="json")
        for key in keys:
            try:
                self._maintain(job, key, statuses, plan, now, parameters, done)
            except ABORTS_A_RUN:
                raise
            except StoreError:
                # Something about this memory (a row the store refuses, say): the others are
                # still maintained, and this one is tried again on the next run.
                done.skipped += 1
                log.exception(
                    "maintenance %s left a memory it could not change",
                    job,
                    extra={
                        "organization_id": key.organization_id,
                        "user_id": key.user_id,
                        "cluster_job": job,
                    },
                )

    def _maintain(
        self,
        job: str,
        key: MemoryKey,
        statuses: Sequence[FactStatus],
        plan: Plan,
        now: datetime,
        parameters: dict[str, Any],
        done: Tally,
    ) -> None:
        memory = self._core.memory
        with memory.memory_lock(key):
            if self._queries.erasure_open(key):
                # The erasure decides what stays: merging a fact being erased into another
                # would have its erasure redact the other's evidence. Next pass, then.
                done.skipped += 1
                log.info(
                    "maintenance %s skips a memory an erasure is open on",
                    job,
                    extra={"organization_id": key.organization_id, "user_id": key.user_id},
                )
                return
            state = memory.load_state(key)
            changes = plan(memory.facts(key, statuses))
            update = maintenance_update(job, state, changes, now, parameters)
            if update is None:
                return
            memory.apply(update)
        done.users += 1
        done.add(rule_counts(changes))
        log.info(
            "maintenance %s changed %d fact(s)",
            job,
            len(changes),
            extra={
                "run_id": str(update.run.run_id),
                "user_id": key.user_id,
                "organization_id": key.organization_id,
                "cluster_job": job,
            },
        )
