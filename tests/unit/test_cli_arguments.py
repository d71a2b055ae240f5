"""`memoryd forget`'s arguments: what the erasure audit would refuse is refused when parsed,
with a usage error, not a traceback."""

from __future__ import annotations

import uuid

import pytest

from memoryd.cli import build_parser

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
