"""Logs: JSON with ids as fields, or text with the ids after the message."""

from __future__ import annotations

import json
import logging

import pytest

from memoryd.ops.logs import configure_logging


@pytest.fixture
def restore_logging() -> object:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield None
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


@pytest.mark.usefixtures("restore_logging")
def test_json_lines_carry_the_ids_as_fields(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("INFO", "json")
    logging.getLogger("memoryd.test").warning(
        "flush failed", extra={"user_id": "ada", "organization_id": "org-a", "run_id": "r-1"}
    )
    line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert line["message"] == "flush failed"
    assert (line["user_id"], line["organization_id"], line["run_id"]) == ("ada", "org-a", "r-1")
    assert (line["level"], line["logger"]) == ("WARNING", "memoryd.test")
    assert "time" in line


@pytest.mark.usefixtures("restore_logging")
def test_text_lines_show_the_ids_after_the_message(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("INFO", "text")
    logging.getLogger("memoryd.test").info("consolidated", extra={"user_id": "ada"})
    logging.getLogger("kafka.conn").info("connected")  # the clients' chatter stays out
    err = capsys.readouterr().err
    assert "memoryd.test: consolidated [user_id=ada]" in err
    assert "connected" not in err
