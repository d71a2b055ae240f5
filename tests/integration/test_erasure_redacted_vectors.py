"""The facts quoting an erased one, in the vector index, on real Postgres and Chroma.

The erasure redacts them in place (same version, same time: the fold of the runs gives
both). The index must lose the erased text with the erasure, not at some later drain, and an
indexer that read them before the redaction must not put the text back for good.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing, contextmanager

import pytest

from domain.ids import MemoryKey
from memoryd import wiring
from memoryd.erasure import Eraser, ErasureRequest
from tests.support.builders import key_of, make_fact, seed
from tests.support.deployment import Deployment

pytestmark = pytest.mark.integration

MIRA = key_of("mira", "org-a")
REQUEST = ErasureRequest("test", "asked by the user")
QUOKKA = make_fact("mira", "Bramble is a quokka", org="org-a")
QUOTING = make_fact("mira", "Mira said Bramble is a quokka at the zoo", org="org-a")


@contextmanager
def eraser(deployment: Deployment) -> Iterator[tuple[wiring.Core, Eraser]]:
    with wiring.core(deployment.settings) as c, closing(wiring.publisher(c.settings)) as pub:
        yield c, wiring.eraser(c, pub)


def document(c: wiring.Core, key: MemoryKey) -> str:
    assert QUOTING.key == key
    return c.index.stored([QUOTING.fact_id])[QUOTING.fact_id].document


def test_the_erasure_takes_the_text_out_of_the_quoting_facts_vectors(
    deployment: Deployment,
) -> None:
    with eraser(deployment) as (c, erase):
        wiring.indexer(c).index_changes(seed(c.memory, "mira", [QUOKKA, QUOTING], org="org-a"))
        assert "Bramble" in document(c, MIRA)
        erase.erase_fact(MIRA, QUOKKA.fact_id, REQUEST)
        # No drain has run (it may leave an out-of-credit memory alone for long).
        assert document(c, MIRA) == "Mira said [erased] at the zoo"


def test_an_indexer_that_read_a_quoting_fact_before_the_erasure_does_not_restore_its_text(
    deployment: Deployment,
) -> None:
    with eraser(deployment) as (c, erase):
        seed(c.memory, "mira", [QUOKKA, QUOTING], org="org-a")
        indexer = wiring.indexer(c)
        before = c.memory.facts_by_id([QUOTING.fact_id])  # read while pending
        erase.erase_fact(MIRA, QUOKKA.fact_id, REQUEST)
        indexer._index_facts(before)  # writes the text it read, then marks
        assert document(c, MIRA) == "Mira said [erased] at the zoo"
        indexer.drain_pending()
        assert c.memory.pending_backlog().count == 0
        assert document(c, MIRA) == "Mira said [erased] at the zoo"
