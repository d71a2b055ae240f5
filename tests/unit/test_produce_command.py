"""`memoryd produce FILE`: every event of the file, or none, and each bad line named by number."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from memoryd import cli
from memoryd.sample_stream import read_events
from memoryd.settings import Settings
from tests.support.builders import make_event


def _write(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_the_files_events_come_back_and_each_bad_line_is_named_with_its_number(
    tmp_path: Path,
) -> None:
    first, second = make_event("ada", "Ada drinks tea"), make_event("bob", "Bob runs")
    path = _write(
        tmp_path / "events.jsonl",
        [first.to_bytes(), b"", b"not json", b'{"event_id": "x"}', second.to_bytes()],
    )
    events, problems = read_events(path)
    assert events == [first, second]
    assert [p.split(": ", 1)[0] for p in problems] == [f"{path}:3", f"{path}:4"]
    assert "not JSON" in problems[0]
    assert "invalid ContextEvent" in problems[1]


def test_a_file_with_a_bad_line_publishes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_publisher(*_args: object) -> None:
        raise AssertionError("a publisher was made for a file with a bad line")

    monkeypatch.setattr(cli.wiring, "publisher", no_publisher)
    path = _write(tmp_path / "events.jsonl", [make_event("ada", "Ada drinks tea").to_bytes(), b"{"])
    code = cli.cmd_produce(Settings(), argparse.Namespace(file=str(path)))
    assert code == 2
    err = capsys.readouterr().err
    assert f"{path}:2: not JSON" in err
    assert "1 line(s) are not events (1 are); nothing published" in err


def test_a_missing_file_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.cmd_produce(Settings(), argparse.Namespace(file="/no/such/events.jsonl"))
    assert code == 2
    assert "cannot read /no/such/events.jsonl: No such file or directory" in capsys.readouterr().err
