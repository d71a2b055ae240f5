"""The dependency direction of design.md, checked on the import statements of every module.

    producers ← consumers → processors → domain ← store;  consumers also use store.

`domain` is the bottom: it imports no other package of the project. `processors` is pure logic
over `domain` and the event contract; only its `llm` subpackage may talk to a network.
`store.inmemory` implements the ports without a driver. And the modules stay small.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("domain", "producers", "consumers", "processors", "store", "memoryd")

# package -> first-party modules it may import (a module or any module below it)
ALLOWED = {
    "domain": {"domain"},
    "producers": {"producers"},
    "processors": {"processors", "domain", "producers.contract"},
    "store": {"store", "domain", "producers.contract"},
    "consumers": {"consumers", "processors", "store", "domain", "producers"},
    "memoryd": set(PACKAGES),
}
NETWORK_CLIENTS = {
    "kafka",
    "psycopg",
    "psycopg_pool",
    "chromadb",
    "google.genai",
    "httpx",
    "httpx2",
}
# package (or subpackage) -> third-party clients it must not touch
FORBIDDEN_CLIENTS = {
    "domain": NETWORK_CLIENTS | {"onnx", "onnxruntime", "prometheus_client", "pydantic"},
    "producers": {"psycopg", "psycopg_pool", "chromadb", "google.genai", "onnx", "onnxruntime"},
    "processors": NETWORK_CLIENTS,
    "processors.llm": {"kafka", "psycopg", "psycopg_pool", "chromadb"},
    "store": {"kafka", "google.genai"},
    "store.inmemory": NETWORK_CLIENTS | {"onnx", "onnxruntime", "prometheus_client"},
}
MAX_MODULE_LINES = 400
# Sample data, not code; and the offline backend, whose rewrite is under way elsewhere.
LONG_MODULES_ALLOWED = {"memoryd/sample_content.py", "processors/offline.py"}


def imported_modules(path: Path) -> set[str]:
    """Every absolute module an import statement names (`from a.b import c` names a.b and a.b.c)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
    return modules


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _layer(path: Path) -> tuple[str, str]:
    """(package, most specific key of FORBIDDEN_CLIENTS that applies)."""
    parts = path.relative_to(ROOT).parts
    package = parts[0]
    sub = f"{package}.{parts[1]}" if len(parts) > 2 else package
    return package, sub if sub in FORBIDDEN_CLIENTS else package


MODULES = sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_imports_follow_the_data_flow(path: Path) -> None:
    package, layer = _layer(path)
    modules = imported_modules(path)
    first_party = {m for m in modules if m.split(".")[0] in PACKAGES}
    refused = {m for m in first_party if not any(_within(m, a) for a in ALLOWED[package])}
    assert not refused, f"{package} may not import {refused}"
    forbidden = FORBIDDEN_CLIENTS.get(layer, set())
    clients = {c for c in forbidden for m in modules if _within(m, c)}
    assert not clients, f"{layer} may not import {clients}"


def test_domain_is_the_bottom() -> None:
    """No first-party package but domain itself reaches into domain's imports."""
    domain_modules = sorted((ROOT / "domain").rglob("*.py"))
    assert domain_modules
    for path in domain_modules:
        first_party = {m.split(".")[0] for m in imported_modules(path)} & set(PACKAGES)
        assert first_party <= {"domain"}, f"{path.name} imports {first_party}"


def test_modules_stay_small() -> None:
    sources = [*MODULES, *sorted((ROOT / "bench").rglob("*.py"))]
    long = {
        str(p.relative_to(ROOT)): n
        for p in sources
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert set(long) <= LONG_MODULES_ALLOWED, f"over {MAX_MODULE_LINES} lines: {long}"


@pytest.mark.parametrize(
    ("source", "package", "allowed"),
    [
        ("from consumers.processor import MemoryProcessor\nimport kafka\n", "processors", False),
        ("from producers.publisher import KafkaEventPublisher\n", "processors", False),
        ("from producers.contract import ContextEvent\n", "processors", True),
        ("from domain.model import Fact\n", "store", True),
        ("from store.postgres import make_pool\n", "domain", False),
    ],
)
def test_the_check_sees_a_violation(
    tmp_path: Path, source: str, package: str, *, allowed: bool
) -> None:
    module = tmp_path / "m.py"
    module.write_text(source)
    first_party = {m for m in imported_modules(module) if m.split(".")[0] in PACKAGES}
    ok = all(any(_within(m, a) for a in ALLOWED[package]) for m in first_party)
    assert ok is allowed
