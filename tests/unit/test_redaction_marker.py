"""The erasure's marker is spelled once in the code (domain.erasure), and the SQL erase
functions write that same marker: the eraser finds the facts they redacted by it. The event
contract, which imports nothing of the domain, spells it too, as the content it refuses."""

from __future__ import annotations

import ast
from pathlib import Path

from domain.erasure import REDACTED_JSON, REDACTION
from producers.contract import RESERVED_CONTENTS
from store.migrate import bundled_migrations
from tests.unit.test_architecture import PACKAGES, ROOT

HOMES = {Path("domain/erasure.py"), Path("producers/contract.py")}


def test_no_module_but_the_domain_and_the_contract_spells_the_marker() -> None:
    spelled = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.relative_to(ROOT) not in HOMES
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and REDACTION in node.value
    ]
    assert spelled == []


def test_the_latest_erase_fact_writes_the_domain_marker() -> None:
    latest = [m.sql for m in bundled_migrations() if "FUNCTION erase_fact(" in m.sql][-1]
    assert f"'{REDACTION}'" in latest
    assert f"'{REDACTED_JSON}'" in latest  # a scaffold update's content is JSON


def test_the_contract_refuses_exactly_what_an_erasure_writes_over_an_event() -> None:
    # A flush drops a logged event of either text as erased (store.write.flush_sql).
    assert {REDACTION, REDACTED_JSON} == RESERVED_CONTENTS
