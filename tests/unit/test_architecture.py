"""The dependency direction of design.md, checked on the import statements of every module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("producers", "consumers", "processors", "store", "memoryd")

# package -> first-party packages it may import
ALLOWED = {
    "producers": {"producers"},
    "processors": {"processors", "store", "producers"},
    "store": {"store", "producers"},
    "consumers": {"consumers", "processors", "store", "producers"},
    "memoryd": set(PACKAGES),
}
# package -> third-party clients it must not touch
FORBIDDEN_CLIENTS = {
    "producers": {"psycopg", "psycopg_pool", "chromadb", "google", "onnxruntime"},
    "processors": {"kafka", "psycopg", "psycopg_pool", "chromadb"},
    "store": {"kafka", "google"},
}


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


MODULES = sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_imports_follow_the_data_flow(path: Path) -> None:
    package = path.relative_to(ROOT).parts[0]
    roots = imported_roots(path)
    first_party = roots & set(PACKAGES)
    assert first_party <= ALLOWED[package], (
        f"{package} may not import {first_party - ALLOWED[package]}"
    )
    clients = roots & FORBIDDEN_CLIENTS.get(package, set())
    assert not clients, f"{package} may not import {clients}"


def test_the_check_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "m.py"
    bad.write_text("from consumers.processor import MemoryProcessor\nimport kafka\n")
    assert imported_roots(bad) == {"consumers", "kafka"}
