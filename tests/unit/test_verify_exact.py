"""`replay verify` wants the live memory to be the fold of its runs exactly: its version, and
learned and connection info as the lists they are stored as (a shadow replay compares sets)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from domain.ids import MemoryKey
from memoryd.analyst.verify import render_verification, verification_json, verify_memory
from processors.diff import VERIFY_FIELDS, diff_memory
from processors.fold import FoldedMemory

LIVE = FoldedMemory(
    user_id="ada",
    organization_id="org-a",
    learned_info=("Her manager is Grace", "Likes tea"),
    connections={"mail": ("Acme pays in EUR", "Invoices go to finance")},
    version=2,
)


@pytest.mark.parametrize(
    ("changes", "difference"),
    [
        ({"version": 3}, {"version": (2, 3)}),
        (
            {"learned_info": (*LIVE.learned_info, "Likes tea")},
            {"learned_info": ((), ("Likes tea",))},
        ),
        ({"learned_info": LIVE.learned_info[::-1]}, {"reordered": ("learned_info",)}),
        (
            {"connections": {"mail": (*LIVE.connections["mail"], "Acme pays in EUR")}},
            {"connections": {"mail": ((), ("Acme pays in EUR",))}},
        ),
        ({"connections": {"mail": LIVE.connections["mail"][::-1]}}, {"reordered": ("mail",)}),
    ],
)
def test_verify_sees_what_a_shadow_diff_leaves_out(
    changes: dict[str, Any], difference: dict[str, Any]
) -> None:
    folded = replace(LIVE, **changes)
    exact = diff_memory(LIVE, folded, VERIFY_FIELDS, exact=True)
    assert not exact.identical
    for name, value in difference.items():
        assert getattr(exact, name) == value
    # Another model or batching may repeat or reorder what it learns: no difference there.
    assert diff_memory(LIVE, folded).identical
    assert diff_memory(LIVE, LIVE, VERIFY_FIELDS, exact=True).identical


def test_a_version_no_run_made_fails_verify() -> None:
    key = MemoryKey("org-a", "ada")
    live = FoldedMemory(user_id="ada", organization_id="org-a", version=5)
    v = verify_memory(key, [], live)
    assert not v.ok
    assert "version live=5 folded=0" in render_verification(v)
    assert verification_json(v)["diff"]["version"] == {"live": 5, "shadow": 0}
