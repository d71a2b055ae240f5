"""The erasure commands' arguments: what the erasure audit would refuse is refused when
parsed, with a usage error, not a traceback; `memoryd erasures` names one memory or --open."""

from __future__ import annotations

import uuid

import pytest

from memoryd import wiring
from memoryd.cli import build_parser
from memoryd.settings import Settings

FACT = "3f2b8c1e-0d4a-4c55-9e2f-6a7b8c9d0e1f"


@pytest.mark.parametrize(
    "extra",
    [["--reason", " "], ["--reason", "\r"], ["--actor", "\t"], ["--fact", "not-a-fact-id"]],
)
def test_forget_refuses_a_blank_reason_or_actor_and_a_fact_id_that_is_no_uuid(
    extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["forget", "--org", "acme", "ada", *extra])
    assert exit_.value.code == 2
    assert extra[0] in capsys.readouterr().err


def test_forget_takes_a_fact_id_as_a_uuid() -> None:
    args = build_parser().parse_args(["forget", "--org", "acme", "ada", "--fact", FACT])
    assert args.fact == uuid.UUID(FACT)
    assert args.reason == "erasure request"


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        ([], "give --org ORG USER, or --open alone"),
        (["--open", "--org", "acme", "ada"], "give --org ORG USER, or --open alone"),
        (["--open", "ada"], "give --org ORG USER, or --open alone"),
        (["ada"], "--org ORG USER: both are needed"),
        (["--org", "acme"], "--org ORG USER: both are needed"),
    ],
)
def test_erasures_wants_one_memory_or_open_before_connecting(
    argv: list[str],
    why: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def no_core(_settings: Settings) -> None:
        raise AssertionError("connected before checking its arguments")

    monkeypatch.setattr(wiring, "core", no_core)
    args = build_parser().parse_args(["erasures", *argv])
    assert args.fn(Settings(), args) == 2
    assert capsys.readouterr().err == f"memoryd erasures: {why}\n"
