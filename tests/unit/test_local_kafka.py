"""LocalKafka.start without a JVM: what it times, what it adopts. The steps that would download
jars or launch a broker are replaced by stand-ins on a fake clock."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from memoryd.dev import DevPorts, LocalKafka
from memoryd.dev import kafka as kafka_module
from memoryd.dev._process import ServiceProcess


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(kafka_module, "time", SimpleNamespace(monotonic=fake.monotonic))
    return fake


def _kafka(tmp_path: Path) -> LocalKafka:
    ports = DevPorts.free()
    return LocalKafka(
        tmp_path / "kafka",
        ports.kafka,
        ports.kafka_controller,
        pom=tmp_path / "pom.xml",
        jars_cache=tmp_path / "jars",
    )


def test_a_slow_first_download_leaves_the_broker_its_whole_start_timeout(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    kafka = _kafka(tmp_path)
    deadlines: list[float] = []

    def slow_download() -> Path:
        clock.sleep(600.0)
        return tmp_path / "jars"

    def slow_format(_java: str, _libs: Path) -> None:
        clock.sleep(60.0)

    def spawn(_self: ServiceProcess, _argv: Sequence[str], **_kw: Any) -> int:
        return 4_000_000

    monkeypatch.setattr(kafka, "ensure_jars", slow_download)
    monkeypatch.setattr(kafka, "_format", slow_format)
    monkeypatch.setattr(kafka, "_wait_ready", deadlines.append)
    monkeypatch.setattr(kafka_module, "_find_java", lambda: "/usr/bin/java")
    monkeypatch.setattr(ServiceProcess, "spawn", spawn)

    kafka.start(timeout=120.0)

    assert deadlines == [clock.now + 120.0]
