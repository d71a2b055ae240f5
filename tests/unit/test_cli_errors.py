"""What `memoryd` says when it cannot run: a line naming the cause and an exit code, not a
traceback, for settings it cannot use and for a service that is away; a bug still raises."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from memoryd import cli
from memoryd.dev import ServiceError
from memoryd.ops.topics import TopicConfigError
from memoryd.redrive import RedriveError
from memoryd.settings import Settings
from producers.errors import PublishError
from store.errors import DatabaseUnavailable


@pytest.fixture(autouse=True)
def _logging_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "configure_logging", lambda *_args: None)


def _failing_migrate(error: Exception, monkeypatch: pytest.MonkeyPatch) -> None:
    def migrate(_settings: Settings, _args: argparse.Namespace) -> int:
        raise error

    monkeypatch.setattr(cli, "cmd_migrate", migrate)


def test_a_settings_file_that_is_not_there_is_an_error_not_the_defaults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "memoryd.toml"
    assert cli.main(["--config", str(missing), "migrate"]) == 2
    assert f"no settings file {missing}" in capsys.readouterr().err


def test_a_settings_file_that_is_not_toml_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "memoryd.toml"
    bad.write_text("[kafka\n")
    assert cli.main(["--config", str(bad), "migrate"]) == 2
    assert "the settings cannot be used" in capsys.readouterr().err


def test_a_setting_of_the_wrong_type_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MEMORYD_PROCESSOR__MAX_BATCH", "many")
    assert cli.main(["migrate"]) == 2
    assert "processor.max_batch" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("MEMORYD_POSTGRES__URL", "postgresql://db/memoryd", "postgres.url"),  # not DSN
        ("MEMORYD_PROCESSOR__MAX_BATCHES", "10", "processor.max_batches"),
        ("MEMORYD_API__TOKENS", "{not json", 'field "api"'),
        ("MEMORYD_LOG_LEVEL", "LOUD", "log_level"),
        ("MEMORYD_CHROMA__URL", "chroma:8000", "chroma url"),
        ("MEMORYD_CHROMA__URL", "http://chroma:8000/api", "chroma url"),
        ("MEMORYD_LLM__BACKEND", "gemini", "MEMORYD_LLM__API_KEY"),  # no key
        ("MEMORYD_READ_PATH__REWRITE", "gemini", "MEMORYD_LLM__API_KEY"),
    ],
)
def test_a_mistyped_nested_setting_or_a_malformed_value_is_an_error_not_a_default(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variable: str,
    value: str,
    named: str,
) -> None:
    monkeypatch.setenv(variable, value)
    assert cli.main(["migrate"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memoryd: the settings cannot be used")
    assert named in err


def test_prices_given_are_added_to_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    given = {"gemini-3-flash": {"input_usd_per_mtok": 0.5, "output_usd_per_mtok": 3.0}}
    monkeypatch.setenv("MEMORYD_PRICES", json.dumps(given))
    monkeypatch.setenv("MEMORYD_LOG_LEVEL", "debug")
    settings = Settings()
    assert settings.prices["gemini-3-flash"].output_usd_per_mtok == 3.0
    assert "gemini-2.5-flash" in settings.prices  # still priced: the processor keeps starting
    assert settings.log_level == "DEBUG"


@pytest.mark.parametrize(
    "error",
    [
        DatabaseUnavailable("cannot connect to Postgres: refused"),
        PublishError("events not acknowledged: KafkaTimeoutError"),
        TopicConfigError("the broker refused retention.ms: TopicAuthorizationFailed"),
        RedriveError("no partition of events.dlq assigned"),
        ServiceError("java is not on the PATH"),
    ],
)
def test_a_service_away_is_one_line_and_exit_code_69(
    error: Exception, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _failing_migrate(error, monkeypatch)
    assert cli.main(["migrate"]) == cli.EXIT_UNAVAILABLE == 69
    err = capsys.readouterr().err
    assert err == f"memoryd migrate: {type(error).__name__}: {error}\n"


@pytest.fixture
def no_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """The arguments are checked before anything connects."""

    def no_core(*_args: object) -> None:
        raise AssertionError("connected before checking the arguments")

    monkeypatch.setattr(cli.wiring, "core", no_core)


@pytest.mark.usefixtures("no_connection")
def test_a_replay_of_batches_of_none_or_with_gemini_and_no_key_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as usage:
        cli.main(["replay", "--org", "acme", "ada", "--max-batch", "0"])
    assert usage.value.code == 2
    assert "must be 1 or more" in capsys.readouterr().err
    assert cli.main(["replay", "--org", "acme", "ada", "--backend", "gemini"]) == 2
    assert "needs MEMORYD_LLM__API_KEY" in capsys.readouterr().err


def test_a_bug_still_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    _failing_migrate(RuntimeError("a bug"), monkeypatch)
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["migrate"])


@pytest.mark.usefixtures("no_connection")
def test_forget_without_a_user_says_so_before_connecting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["forget"]) == 2
    assert "--org ORG USER is required" in capsys.readouterr().err


@pytest.mark.parametrize("organization", ["acme\x1feu", "acme eu", ""])
def test_a_token_for_an_organization_that_is_no_identifier_is_refused(
    organization: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ids derived from the organization join it with the user and the caller's keys: an
    organization spelled with the separator could meet another's."""
    monkeypatch.setenv("MEMORYD_API__TOKENS", json.dumps({"0" * 64: organization}))
    assert cli.main(["migrate"]) == 2
    assert "api.tokens" in capsys.readouterr().err


@pytest.mark.usefixtures("no_connection")
@pytest.mark.parametrize(
    "argv",
    [
        ["replay", "--org", "", "ada"],
        ["replay", "--org", "acme", ""],
        ["history", "--org", "", "ada"],
        ["export", "--org", "acme", "", "--out", "ada.json"],
        ["context", "--org", "", "ada", "--query", "where does she work?"],
        ["replay", "verify", "--all", "--org", ""],
        ["replay", "verify", "--org", "acme", "--user", ""],
        ["explain", "3f2b8c1e-0d4a-4c55-9e2f-6a7b8c9d0e1f", "--org", ""],
    ],
)
def test_an_empty_organization_or_user_is_a_usage_error_before_connecting(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # It failed as a ValueError of `MemoryKey`, a traceback, or as a check of nothing.
    with pytest.raises(SystemExit) as usage:
        cli.main(argv)
    assert usage.value.code == 2
    *_usage_lines, why = capsys.readouterr().err.splitlines()
    assert why.endswith("not an id (1 to 128 of A-Z a-z 0-9 _ . : @ -): ''"), why
