"""`memoryd dev`: what each action does to the local services, with their launchers replaced."""

from __future__ import annotations

from pathlib import Path

import pytest

from memoryd.cli import build_parser
from memoryd.dev import LocalChroma, LocalKafka, LocalPostgres
from memoryd.settings import DevSettings, Settings


def test_dev_fetch_fetches_the_kafka_jars_and_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_start(*_args: object, **_kwargs: object) -> str:
        raise AssertionError("dev fetch started a service")

    for service in (LocalKafka, LocalPostgres, LocalChroma):
        monkeypatch.setattr(service, "start", no_start)
    fetched: list[Path] = []

    def ensure_jars(kafka: LocalKafka) -> Path:
        fetched.append(kafka.jars_cache)
        return kafka.jars_cache / "0123456789abcdef"

    monkeypatch.setattr(LocalKafka, "ensure_jars", ensure_jars)
    monkeypatch.setenv("MEMORYD_CACHE_DIR", str(tmp_path / "cache"))
    args = build_parser().parse_args(["dev", "fetch"])

    assert args.fn(Settings(dev=DevSettings(state_dir=tmp_path / "state")), args) == 0
    assert fetched == [tmp_path / "cache" / "kafka-jars"]
    jars = tmp_path / "cache" / "kafka-jars" / "0123456789abcdef"
    assert capsys.readouterr().out == f"kafka jars in {jars}\n"
