"""Which local services the demo starts, points at and stops, with the launchers replaced and the
pipeline cut short at its first use of Postgres."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from memoryd import demo
from memoryd.dev import LocalChroma, LocalKafka, LocalPostgres
from memoryd.settings import DevSettings, Settings

SERVICES = {"kafka": LocalKafka, "postgres": LocalPostgres, "chroma": LocalChroma}


class Stop(Exception):
    """Raised where the demo would first talk to a service."""


@dataclass
class Launchers:
    running: set[str] = field(default_factory=set)
    started: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    dsn: list[str] = field(default_factory=list)


@pytest.fixture
def launchers(monkeypatch: pytest.MonkeyPatch) -> Launchers:
    record = Launchers()
    for name, cls in SERVICES.items():

        def is_running(_self: object, name: str = name) -> bool:
            return name in record.running

        def start(_self: object, timeout: float = 0.0, name: str = name) -> str:
            if name not in record.running:
                record.started.append(name)
                record.running.add(name)
            return f"{name}-address"

        def stop(_self: object, timeout: float = 0.0, name: str = name) -> None:
            if name in record.running:
                record.stopped.append(name)
                record.running.discard(name)

        monkeypatch.setattr(cls, "is_running", is_running)
        monkeypatch.setattr(cls, "start", start)
        monkeypatch.setattr(cls, "stop", stop)

    def make_pool(dsn: str, **_kwargs: object) -> None:
        record.dsn.append(dsn)
        raise Stop

    monkeypatch.setattr(demo, "make_pool", make_pool)
    return record


def _settings(tmp_path: Path) -> Settings:
    return Settings(dev=DevSettings(state_dir=tmp_path / "state"))


def test_the_demo_leaves_running_the_services_it_found_running(
    tmp_path: Path, launchers: Launchers
) -> None:
    launchers.running = {"kafka", "postgres"}  # as `memoryd dev up` left them, say

    with pytest.raises(Stop):
        demo.run_demo(_settings(tmp_path))

    assert launchers.dsn == ["postgres-address"]
    assert launchers.started == ["chroma"]
    assert launchers.stopped == ["chroma"]
    assert launchers.running == {"kafka", "postgres"}


def test_the_demo_stops_what_it_started_unless_told_to_keep_it(
    tmp_path: Path, launchers: Launchers
) -> None:
    with pytest.raises(Stop):
        demo.run_demo(_settings(tmp_path))
    assert sorted(launchers.stopped) == ["chroma", "kafka", "postgres"]

    launchers.started.clear()
    launchers.stopped.clear()
    with pytest.raises(Stop):
        demo.run_demo(_settings(tmp_path), keep_services=True)
    assert sorted(launchers.started) == ["chroma", "kafka", "postgres"]
    assert launchers.stopped == []
