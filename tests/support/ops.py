"""Helpers for the operations tests: processes in threads with their ops port, scraping."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from memoryd import wiring
from memoryd.ops.config import OpsSettings
from memoryd.ops.runtime import run_log_writer, run_processor
from memoryd.settings import MetricsSettings, Settings
from processors.schema import BackendResponse, ConsolidationBackend, ConsolidationRequest

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def with_ops_ports(settings: Settings, ports: tuple[int, int, int], **ops: Any) -> Settings:
    """Settings whose processes serve their ops port, and measure and check quickly."""
    return settings.model_copy(
        update={
            "metrics": MetricsSettings(
                enabled=True,
                log_writer_port=ports[0],
                processor_port=ports[1],
                api_port=ports[2],
            ),
            "ops": OpsSettings(
                health_interval_s=0.3, health_timeout_s=2.0, telemetry_every_s=0.5, **ops
            ),
            "maintenance": settings.maintenance.model_copy(update={"enabled": False}),
        }
    )


def get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - local
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode()


def scrape(port: int) -> Samples:
    status, text = get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(samples: Samples, name: str, **labels: str) -> float | None:
    """The sum of a metric's samples with these labels; None when there is none."""
    hits = [
        v
        for (n, ls), v in samples.items()
        if n == name and all(dict(ls).get(k) == want for k, want in labels.items())
    ]
    return sum(hits) if hits else None


def wait_for(what: str, check: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except OSError as e:  # the process has not opened its port yet (connection refused)
            last = e
        else:
            if last:
                return last
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


class PausableBackend:
    """Wraps a backend; while paused, consolidations wait (the pipeline stalls, as when an
    LLM provider hangs)."""

    def __init__(self, inner: ConsolidationBackend) -> None:
        self._inner = inner
        self.name = inner.name
        self.model = inner.model
        self.prompt_version = inner.prompt_version
        self.running = threading.Event()
        self.running.set()

    def consolidate(self, request: ConsolidationRequest) -> BackendResponse:
        if not self.running.wait(timeout=240):
            raise TimeoutError("the test never resumed the backend")
        return self._inner.consolidate(request)


@contextmanager
def running(target: Callable[[threading.Event], None]) -> Iterator[threading.Event]:
    stop = threading.Event()
    failures: list[BaseException] = []

    def body() -> None:
        try:
            target(stop)
        except BaseException as e:
            failures.append(e)
            raise

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join(timeout=90)
    assert not thread.is_alive(), "the process did not stop"
    assert not failures, failures


@contextmanager
def log_writer_process(settings: Settings) -> Iterator[None]:
    with wiring.core(settings) as c, running(lambda stop: run_log_writer(c, stop)):
        yield


@contextmanager
def processor_process(
    settings: Settings, backend: Callable[[wiring.Core], ConsolidationBackend] | None = None
) -> Iterator[wiring.Core]:
    with (
        wiring.core(settings) as c,
        running(lambda stop: run_processor(c, stop, backend(c) if backend else None)),
    ):
        yield c
