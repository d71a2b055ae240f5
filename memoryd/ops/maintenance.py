"""The maintenance jobs: lifecycle, duplicate sweep, retention of read audit rows, and the
vector index checked against Postgres (`consumers.index_check`, repaired where it differs).

Each memory is changed under the user's advisory lock (the one flushes take), by one run
written like a consolidation run (processors.maintenance.maintenance_update), so the fold of
the run log reproduces it; each job execution is also recorded in `maintenance_runs`. The
rules move every fact they touch out of their own reach, so a second run changes nothing.
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
from store.errors import StoreError
from store.write.maintenance_queries import MaintenanceQueries, MaintenanceRunRow

log = logging.getLogger(__name__)
JOBS = ("lifecycle", "dedupe", "retention", "index")
INDEX_RULES = ("vectors_absent", "vectors_differing", "vectors_orphaned")


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
# memories changed, changes by rule, memories left for the next run
Done = tuple[int, dict[str, int], int]


class MaintenanceRunner:
    def __init__(
        self, core: Core, settings: MaintenanceSettings, metrics: MaintenanceMetrics | None = None
    ) -> None:
        self._core = core
        self._settings = settings
        self._metrics = metrics
        self._queries = MaintenanceQueries(core.pool)
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
        try:
            users, changes, skipped = getattr(self, f"_{job}")(now)
        except StoreError as e:
            self._record(MaintenanceRunRow(run_id, job, now, "failed", 0, {}, parameters, str(e)))
            raise
        report = JobReport(job, run_id, users, changes, skipped)
        self._record(
            MaintenanceRunRow(
                run_id, job, now, "succeeded", users, changes, parameters, skipped=skipped
            )
        )
        log.info(
            "maintenance %s changed %d item(s) in %d memories, left %d for the next run",
            job,
            report.changed,
            users,
            skipped,
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

    def _lifecycle(self, now: datetime) -> Done:
        policy = lifecycle_policy(self._settings)
        keys = self._queries.lifecycle_candidates(
            active_before=now - min(policy.stale_after, policy.ephemeral_stale_after),
            stale_before=now - policy.archive_after,
        )
        return self._per_memory(
            "lifecycle",
            keys,
            (FactStatus.ACTIVE, FactStatus.STALE),
            lambda facts: lifecycle_changes(facts, now, policy),
            now,
        )

    def _dedupe(self, now: datetime) -> Done:
        s = self._settings
        policy = DuplicatePolicy(threshold=s.duplicate_threshold, max_facts=s.duplicate_max_facts)
        # Since the last run that left no memory alone: one it left may have changed before.
        keys = self._queries.duplicate_candidates(self._queries.last_complete("dedupe"))
        embedder = self._core.embedder
        return self._per_memory(
            "dedupe",
            keys,
            (FactStatus.ACTIVE,),
            lambda facts: duplicate_changes(facts, now, embedder, policy),
            now,
        )

    def _retention(self, now: datetime) -> Done:
        before = now - timedelta(days=self._settings.context_log_retention_days)
        deleted = self._queries.delete_context_logs(before)
        if self._metrics is not None:
            self._metrics.context_logs_deleted.inc(deleted)
        return 0, {"context_logs_deleted": deleted} if deleted else {}, 0

    def _index(self, _now: datetime) -> Done:
        # Counted as what it found, which is what an operator wants to hear of: Chroma lost
        # vectors or holds erased ones (the MemorydIndexRepaired alert).
        found = index_checker(self._core).check(repair=True)
        changes = dict(
            zip(INDEX_RULES, (found.absent, found.differing, found.orphans), strict=True)
        )
        return 0, {rule: n for rule, n in changes.items() if n}, 0

    def _per_memory(
        self,
        job: str,
        keys: Sequence[MemoryKey],
        statuses: Sequence[FactStatus],
        plan: Plan,
        now: datetime,
    ) -> Done:
        memory = self._core.memory
        parameters: dict[str, Any] = self._settings.model_dump(mode="json")
        users = skipped = 0
        totals: dict[str, int] = {}
        for key in keys:
            with memory.memory_lock(key):
                if self._queries.erasure_open(key):
                    # The erasure decides what stays: merging a fact being erased into another
                    # would have its erasure redact the other's evidence. Next pass, then.
                    skipped += 1
                    log.info(
                        "maintenance %s skips a memory an erasure is open on",
                        job,
                        extra={"organization_id": key.organization_id, "user_id": key.user_id},
                    )
                    continue
                state = memory.load_state(key)
                facts = memory.facts(key, statuses)
                changes = plan(facts)
                update = maintenance_update(job, state, changes, now, parameters)
                if update is None:
                    continue
                memory.apply(update)
            users += 1
            for rule, n in rule_counts(changes).items():
                totals[rule] = totals.get(rule, 0) + n
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
        return users, totals, skipped
