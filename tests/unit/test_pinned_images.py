"""The Docker images the test fixtures and infra/compose.yaml pull are pinned to exact versions,
the same in both, and Kafka's and Chroma's are the versions the rest of the repository uses: a
tag such as postgres:16 moves with every minor release, and a run would test whatever it pulled."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
# A tag with at least major.minor (v3.5.0, 4.1.1, 16.13), or a digest.
PINNED = re.compile(r"^[\w./-]+(:v?\d+\.\d+[\w.-]*|@sha256:[0-9a-f]{64})$")


def _fixture_images() -> dict[str, str]:
    text = (REPO_ROOT / "tests" / "conftest.py").read_text(encoding="utf-8")
    return dict(re.findall(r'^(\w+)_IMAGE = "([^"]+)"$', text, re.MULTILINE))


def _compose_images() -> set[str]:
    text = (REPO_ROOT / "infra" / "compose.yaml").read_text(encoding="utf-8")
    return set(re.findall(r"^\s+image:\s*(\S+)\s*$", text, re.MULTILINE))


def test_the_fixtures_name_the_three_images() -> None:
    assert set(_fixture_images()) == {"KAFKA", "POSTGRES", "CHROMA"}


@pytest.mark.parametrize("image", sorted({*_fixture_images().values(), *_compose_images()}))
def test_an_image_is_pinned_to_an_exact_version(image: str) -> None:
    assert PINNED.match(image), f"{image} is not pinned to an exact version"


def test_the_fixtures_pull_what_compose_runs() -> None:
    assert set(_fixture_images().values()) <= _compose_images()


def test_kafka_and_chroma_images_are_the_versions_the_repository_uses() -> None:
    images = _fixture_images()
    pom = (REPO_ROOT / "infra" / "kafka" / "pom.xml").read_text(encoding="utf-8")
    lock = (REPO_ROOT / "requirements.lock").read_text(encoding="utf-8")
    kafka = re.search(r"<kafka.version>([^<]+)</kafka.version>", pom)
    chromadb = re.search(r"^chromadb==(\S+)", lock, re.MULTILINE)
    assert kafka is not None
    assert chromadb is not None

    assert images["KAFKA"] == f"apache/kafka:{kafka.group(1)}"
    assert images["CHROMA"] == f"chromadb/chroma:{chromadb.group(1)}"
