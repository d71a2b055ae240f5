"""Which local services the demo starts, points at and stops, with the launchers replaced and the
pipeline cut short where it would first talk to Kafka."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from memoryd import demo
from memoryd.dev import LocalChroma, LocalKafka, LocalPostgres
from memoryd.settings import ChromaSettings, DevSettings, Settings

SERVICES = {"kafka": LocalKafka, "postgres": LocalPostgres, "chroma": LocalChroma}
LOCAL = {
    "kafka": "127.0.0.1:29092",
    "postgres": "postgresql://postgres@127.0.0.1:25432/memoryd",
    "chroma": "http://127.0.0.1:28000",
}


class Stop(Exception):
    """Raised where the demo would first talk to a service."""


@dataclass
class Launchers:
    running: set[str] = field(default_factory=set)
    started: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    dsn: list[str] = field(default_factory=list)
    bootstrap: list[str] = field(default_factory=list)
    chroma_url: list[str] = field(default_factory=list)


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
            return LOCAL[name]

        def stop(_self: object, timeout: float = 0.0, name: str = name) -> None:
            if name in record.running:
                record.stopped.append(name)
                record.running.discard(name)

        monkeypatch.setattr(cls, "is_running", is_running)
        monkeypatch.setattr(cls, "start", start)
        monkeypatch.setattr(cls, "stop", stop)

    class Pool:
        def close(self) -> None:
            pass

    def make_pool(dsn: str, **_kwargs: object) -> Pool:
        record.dsn.append(dsn)
        return Pool()

    def ensure_topics(settings: Settings) -> None:
        record.bootstrap.append(settings.kafka.bootstrap_servers)
        record.chroma_url.append(settings.chroma.url)
        raise Stop

    monkeypatch.setattr(demo, "make_pool", make_pool)
    monkeypatch.setattr(demo, "migrate", lambda _pool: None)
    monkeypatch.setattr(demo, "ensure_topics", ensure_topics)
    return record


def _settings(tmp_path: Path, chroma: ChromaSettings | None = None) -> Settings:
    return Settings(
        dev=DevSettings(state_dir=tmp_path / "state", chroma_port=28000),
        chroma=chroma or ChromaSettings(path=tmp_path / "embedded"),
    )


def test_the_demo_leaves_running_the_services_it_found_running(
    tmp_path: Path, launchers: Launchers
) -> None:
    launchers.running = {"kafka", "postgres"}  # as `memoryd dev up` left them, say

    with pytest.raises(Stop):
        demo.run_demo(_settings(tmp_path, chroma=ChromaSettings(mode="http")))

    assert launchers.dsn == [LOCAL["postgres"]]
    assert launchers.bootstrap == [LOCAL["kafka"]]
    assert launchers.started == ["chroma"]
    assert launchers.stopped == ["chroma"]
    assert launchers.running == {"kafka", "postgres"}


def test_the_demo_stops_what_it_started_unless_told_to_keep_it(
    tmp_path: Path, launchers: Launchers
) -> None:
    with pytest.raises(Stop):
        demo.run_demo(_settings(tmp_path))
    assert sorted(launchers.stopped) == ["kafka", "postgres"]

    launchers.started.clear()
    launchers.stopped.clear()
    with pytest.raises(Stop):
        demo.run_demo(_settings(tmp_path), keep_services=True)
    assert sorted(launchers.started) == ["kafka", "postgres"]
    assert launchers.stopped == []


def test_the_demo_uses_the_kafka_and_postgres_the_settings_name_and_starts_neither(
    tmp_path: Path,
    launchers: Launchers,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("MEMORYD_KAFKA__BOOTSTRAP_SERVERS", "broker.example:9092")
    monkeypatch.setenv("MEMORYD_POSTGRES__DSN", "postgresql://memoryd:s3cret@db.example/memoryd")

    with pytest.raises(Stop):
        demo.run_demo(_settings(tmp_path))

    assert launchers.bootstrap == ["broker.example:9092"]
    assert launchers.dsn == ["postgresql://memoryd:s3cret@db.example/memoryd"]
    assert "kafka" not in launchers.started
    assert "postgres" not in launchers.started
    shown = capsys.readouterr().out
    assert "broker.example:9092 (from the settings)" in shown
    assert "db.example" in shown
    assert "s3cret" not in shown


def test_the_demo_starts_no_chroma_server_for_embedded_chroma(
    tmp_path: Path, launchers: Launchers
) -> None:
    with pytest.raises(Stop):
        demo.run_demo(_settings(tmp_path))

    assert "chroma" not in launchers.started


def test_with_chroma_over_http_the_demo_points_at_the_server_it_starts(
    tmp_path: Path, launchers: Launchers
) -> None:
    # Default url: 18000; the local server listens on the dev port.
    with pytest.raises(Stop):
        demo.run_demo(_settings(tmp_path, chroma=ChromaSettings(mode="http")))

    assert sorted(launchers.started) == ["chroma", "kafka", "postgres"]
    assert launchers.chroma_url == [LOCAL["chroma"]]


def test_a_chroma_url_set_in_the_settings_is_used_and_no_server_started(
    tmp_path: Path, launchers: Launchers
) -> None:
    given = ChromaSettings(mode="http", url="http://chroma.example:8000")

    with pytest.raises(Stop):
        demo.run_demo(_settings(tmp_path, chroma=given))

    assert "chroma" not in launchers.started
    assert launchers.chroma_url == ["http://chroma.example:8000"]
