"""Fault injection on a running memoryd: the log writer and the processor as real processes
(`memoryd log-writer`, `memoryd processor`, each with its metrics port), a stream produced while
a fault is on, and the wait for the pipeline to settle before the invariants are counted.

Every wait is on a condition (events logged, runs written, a gauge), never on a fixed time,
except where the fault itself is a duration (a broker away longer than the session timeout).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from domain.ids import MemoryKey
from memoryd.analyst.invariants import InvariantReport, check_deployment
from memoryd.dev import free_port
from memoryd.settings import Settings
from producers.contract import ContextEvent
from tests.support.builders import key_of, make_event
from tests.support.deployment import Deployment
from tests.support.ops import scrape, total

Expected = dict[MemoryKey, set[uuid.UUID]]
ROLES = ("log-writer", "processor")
SESSION_TIMEOUT_MS = 6_000
TOPICS = ("billing API", "design review", "on-call rota", "Falcon launch", "budget", "hiring")


def process_env(settings: Settings) -> dict[str, str]:
    """The environment that gives a `memoryd` child process these settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORYD_")}
    for section, values in settings.model_dump().items():
        if not isinstance(values, dict):
            env[f"MEMORYD_{section.upper()}"] = str(values)
            continue
        for name, raw in values.items():
            value = raw.get_secret_value() if isinstance(raw, SecretStr) else raw
            if value is None or isinstance(value, dict | list | tuple):
                continue  # defaults are fine for the structured ones (prices, writer and GC tuning)
            env[f"MEMORYD_{section.upper()}__{name.upper()}"] = str(value)
    env.pop("MEMORYD_PRICES", None)
    env.pop("MEMORYD_DEFAULT_PRICE", None)
    return env


def fault_settings(deployment: Deployment, **processor: Any) -> Settings:
    """The deployment's settings with metrics served on free ports, quick health checks and
    small batches, so a short stream is spread over many flushes and commits."""
    s = deployment.settings
    return s.model_copy(
        update={
            # Short, so a member that died is replaced quickly (the test broker allows it).
            "kafka": s.kafka.model_copy(update={"session_timeout_ms": SESSION_TIMEOUT_MS}),
            "metrics": s.metrics.model_copy(
                update={
                    "enabled": True,
                    "log_writer_port": free_port(),
                    "processor_port": free_port(),
                    "api_port": free_port(),
                }
            ),
            "ops": s.ops.model_copy(
                update={"health_interval_s": 0.3, "health_timeout_s": 2.0, "telemetry_every_s": 1.0}
            ),
            "maintenance": s.maintenance.model_copy(update={"enabled": False}),
            "processor": s.processor.model_copy(
                update={
                    "max_batch": 3,
                    "max_wait_s": 0.2,
                    "backoff_base_s": 0.2,
                    "backoff_max_s": 2.0,
                    **processor,
                }
            ),
            "log_format": "text",
        }
    )


@dataclass
class MemorydProcess:
    """`memoryd <role>` as a child process, with its metrics port."""

    role: str
    settings: Settings
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def port(self) -> int:
        m = self.settings.metrics
        return m.log_writer_port if self.role == "log-writer" else m.processor_port

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "memoryd.cli", self.role],
                env=process_env(self.settings),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.starts += 1

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        assert self.proc.returncode == -signal.SIGKILL

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)

    def metric(self, name: str, **labels: str) -> float | None:
        """A sample from its /metrics; None while the port does not answer."""
        try:
            return total(scrape(self.port), name, **labels)
        except OSError:
            return None

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]


@dataclass
class Pipeline:
    processes: dict[str, MemorydProcess] = field(default_factory=dict)

    def __getitem__(self, role: str) -> MemorydProcess:
        return self.processes[role]

    def all_alive(self) -> bool:
        return all(p.alive() for p in self.processes.values())

    def degraded(self, role: str) -> float | None:
        return self[role].metric("memoryd_consumer_degraded", consumer=role)

    def assert_healthy(self, timeout_s: float = 60.0) -> None:
        """Both still running (never restarted by the test unless it killed them), neither
        degraded, and each ready again (its dependencies up)."""
        for role, p in self.processes.items():
            assert p.alive(), f"{role} died:\n{p.log_tail()}"
            wait_until(
                lambda p=p, role=role: self.degraded(role) == 0 and p.metric("memoryd_ready") == 1,
                timeout_s,
                f"{role} healthy again",
                p,
            )

    def logs(self) -> str:
        return "\n".join(f"--- {r} ---\n{p.log_tail()}" for r, p in self.processes.items())


@contextmanager
def pipeline(settings: Settings, log_dir: Path, roles: Sequence[str] = ROLES) -> Iterator[Pipeline]:
    p = Pipeline({r: MemorydProcess(r, settings, log_dir / f"{r}.log") for r in roles})
    try:
        for proc in p.processes.values():
            proc.start()
        for role, proc in p.processes.items():
            wait_until(lambda proc=proc: proc.metric("memoryd_ready") == 1, 300, f"{role} up", proc)
        yield p
    finally:
        for proc in p.processes.values():
            proc.stop()


def wait_until(
    check: Callable[[], object], timeout_s: float, what: str, process: MemorydProcess | None = None
) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            tail = f"\n{process.log_tail()}" if process is not None else ""
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}{tail}")
        time.sleep(0.2)


def make_stream(users: int, per_user: int, prefix: str = "u") -> list[ContextEvent]:
    """`per_user` events for each of `users` users, interleaved as a live stream would be."""
    return [
        make_event(
            f"{prefix}{u}", f"{prefix}{u} works on the {TOPICS[i % len(TOPICS)]} ({i})", minutes=i
        )
        for i in range(per_user)
        for u in range(users)
    ]


def expected_of(events: Sequence[ContextEvent]) -> Expected:
    out: Expected = {}
    for e in events:
        out.setdefault(key_of(e.user_id, e.organization_id), set()).add(e.event_id)
    return out


class Producer:
    """Publishes a stream in small slices from a thread, so a fault lands mid-stream."""

    def __init__(self, deployment: Deployment, events: Sequence[ContextEvent], slice_: int = 6):
        self._deployment = deployment
        self._events = list(events)
        self._slice = slice_
        self._sent = 0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def sent(self) -> int:
        return self._sent

    def start(self) -> Producer:
        self._thread.start()
        return self

    def join(self, timeout_s: float = 120.0) -> None:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the producer did not finish"
        if self._error is not None:
            raise AssertionError(f"producing failed: {self._error!r}") from self._error

    def _run(self) -> None:
        try:
            for i in range(0, len(self._events), self._slice):
                self._deployment.publish(self._events[i : i + self._slice])
                self._sent = i + self._slice
                time.sleep(0.05)
        except BaseException as e:
            self._error = e
            raise


def consolidated_count(deployment: Deployment) -> int:
    return int(deployment.query("SELECT count(*) FROM consolidated_events")[0][0])


def settled(
    settings: Settings,
    expected: Expected,
    timeout_s: float = 300.0,
    *,
    pipeline: Pipeline,
    dead_letters: int = 0,
) -> InvariantReport:
    """Wait until every expected event is logged and consolidated or dead-lettered, and at
    least `dead_letters` letters are readable, then count the invariants once more on the
    quiet pipeline.

    The letters are waited for on their own: a record with no event in it (garbage) is not
    among the expected events, and a letter committed behind a killed process's open
    transaction is invisible to read_committed readers until the broker aborts that one."""
    deadline = time.monotonic() + timeout_s
    report = check_deployment(settings, expected)
    while report.missing_from_log or report.unaccounted or report.dead_lettered < dead_letters:
        if time.monotonic() > deadline:
            raise AssertionError(
                f"not settled after {timeout_s:.0f}s: {report.summary()}\n{pipeline.logs()}"
            )
        time.sleep(1.0)
        report = check_deployment(settings, expected)
    return report
