"""Liveness and readiness of one process, checked in the background.

Each check is a call that raises when its dependency does not answer; a monitor thread runs
them every `health_interval_s`, each bounded by `health_timeout_s`, and keeps the latest
verdict for `/readyz` and the `memoryd_dependency_up` gauges. A probe never runs on the
request thread, so a hung dependency cannot hang the endpoint.

- required: the process cannot do its work without it (Postgres; Kafka for the consumers and
  the API's writes). Down means unready.
- degrades: the process works without it, worse (Chroma: facts stay pending, reads lose the
  dense search). Down means degraded: unready unless `unready_when_degraded` is off.
- the consumer: joined its group (an assignment arrived, possibly empty for a standby member)
  and polling. A loop that has not polled for `loop_stale_s` also fails `/healthz`.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from consumers.liveness import ConsumerLiveness
from memoryd.ops.config import OpsSettings
from memoryd.ops.metrics import HealthMetrics

log = logging.getLogger(__name__)


class Role(StrEnum):
    REQUIRED = "required"
    DEGRADES = "degrades"


@dataclass(frozen=True)
class Check:
    name: str
    probe: Callable[[], object]  # raises when the dependency does not answer
    role: Role = Role.REQUIRED


@dataclass(frozen=True)
class CheckResult:
    up: bool
    role: Role
    error: str | None = None


@dataclass(frozen=True)
class Verdict:
    ready: bool
    checks: dict[str, CheckResult] = field(default_factory=dict)
    degraded: tuple[str, ...] = ()
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        """The whole verdict, errors too: for the operations port, which only operators reach."""
        return {
            "status": "ready" if self.ready else "unready",
            "reason": self.reason or None,
            "degraded": list(self.degraded),
            "checks": {
                name: {"up": r.up, "role": r.role.value, "error": r.error}
                for name, r in sorted(self.checks.items())
            },
        }

    def public_json(self) -> dict[str, Any]:
        """Each dependency by name, ok or failing, and nothing of why: a probe's error names
        hosts, users and pieces of the DSN, and this is what a public port may answer."""
        return {
            "status": "ready" if self.ready else "unready",
            "checks": {
                name: "ok" if r.up else "failing" for name, r in sorted(self.checks.items())
            },
        }


class HealthMonitor:
    def __init__(
        self,
        checks: Sequence[Check],
        settings: OpsSettings,
        metrics: HealthMetrics | None = None,
        consumer: ConsumerLiveness | None = None,
    ) -> None:
        self._checks = list(checks)
        self._settings = settings
        self._metrics = metrics
        self._consumer = consumer
        self._running: dict[str, concurrent.futures.Future[object]] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max(1, len(self._checks)), thread_name_prefix="health"
        )
        self._lock = threading.Lock()
        self._verdict = Verdict(ready=False, reason="not checked yet")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the background loop --------------------------------------------------------------

    def start(self) -> HealthMonitor:
        self._thread = threading.Thread(target=self._loop, name="health-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._settings.health_timeout_s + 1)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self._settings.health_interval_s)

    def refresh(self) -> Verdict:
        results = {c.name: self._run(c) for c in self._checks}
        verdict = self._judge(results)
        with self._lock:
            before, self._verdict = self._verdict, verdict
        _log_changes(before, verdict)
        if self._metrics is not None:
            for name, r in results.items():
                self._metrics.dependency_up.labels(name).set(1 if r.up else 0)
            self._metrics.ready.set(1 if verdict.ready else 0)
        return verdict

    def _run(self, check: Check) -> CheckResult:
        running = self._running.get(check.name)
        if running is not None and not running.done():
            return CheckResult(False, check.role, "the previous check has not returned")
        future = self._pool.submit(check.probe)
        self._running[check.name] = future
        try:
            future.result(timeout=self._settings.health_timeout_s)
        except concurrent.futures.TimeoutError:
            return CheckResult(False, check.role, "no answer in time")
        except Exception as e:  # noqa: BLE001 - any failure of a probe means "down", with why
            return CheckResult(False, check.role, f"{type(e).__name__}: {e}")
        return CheckResult(True, check.role)

    def _judge(self, results: dict[str, CheckResult]) -> Verdict:
        down = sorted(n for n, r in results.items() if not r.up and r.role is Role.REQUIRED)
        degraded = tuple(
            sorted(n for n, r in results.items() if not r.up and r.role is Role.DEGRADES)
        )
        reasons = [f"{n} down" for n in down]
        if self._consumer is not None:
            snap = self._consumer.snapshot()
            if not snap.joined:
                reasons.append("the consumer has not joined its group")
        if degraded and self._settings.unready_when_degraded:
            reasons.append(f"degraded: {', '.join(degraded)} down")
        return Verdict(not reasons, results, degraded, "; ".join(reasons))

    # -- what the endpoints read ----------------------------------------------------------

    def readiness(self) -> Verdict:
        with self._lock:
            return self._verdict

    def liveness(self) -> tuple[bool, str]:
        """Alive unless the consumer loop stopped polling (a wedged main loop)."""
        if self._consumer is None:
            return True, "ok"
        since = self._consumer.snapshot().seconds_since_poll
        if since is not None and since > self._settings.loop_stale_s:
            return False, f"the consumer loop has not polled for {since:.0f}s"
        return True, "ok"


def _log_changes(before: Verdict, now: Verdict) -> None:
    """Log a check that fails, with its error (the public /readyz leaves the error out), and
    one that recovers; once per change, not on every refresh of a dependency down for hours."""
    for name, r in sorted(now.checks.items()):
        was = before.checks.get(name)
        if not r.up and (was is None or was.up or was.error != r.error):
            log.warning("dependency %s failing: %s", name, r.error)
        elif r.up and was is not None and not was.up:
            log.info("dependency %s ok again", name)
