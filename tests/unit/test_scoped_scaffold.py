from __future__ import annotations

from typing import Any

import pytest

from store.read.context_service import scoped_scaffold

S = {"Role": "designer", "Connections": {"gmail": ["a"], "crm": ["b"]}}


@pytest.mark.parametrize(
    ("scaffold", "active", "expected"),
    [
        (S, [], {"Role": "designer"}),
        (S, ["gmail"], {"Role": "designer", "Connections": {"gmail": ["a"]}}),
        (S, ["gmail", "crm"], S),
        (S, ["other"], {"Role": "designer"}),
        ({"Role": "x"}, ["gmail"], {"Role": "x"}),
        # A backend that wrote something else under the key: left as it is, not guessed at.
        ({"Connections": "free text"}, [], {"Connections": "free text"}),
    ],
)
def test_connection_knowledge_is_visible_only_with_its_connection(
    scaffold: dict[str, Any], active: list[str], expected: dict[str, Any]
) -> None:
    assert scoped_scaffold(scaffold, active) == expected
