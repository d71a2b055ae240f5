"""The read path (`ContextService.assemble`) on the in-memory read model and vector index:
scope, the store as the truth over a lagging index, pinning, dedupe, degraded answers, and
what it hands to its background writers and its observer."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from domain.model import FactStatus
from domain.ports import Vector, VectorHit
from store.errors import VectorIndexUnavailable
from store.inmemory import InMemoryVectorIndex
from store.read.bundle import ContextBundle
from store.read.query_rewrite import RewriteOutcome
from store.read.ranking import Budget
from tests.support.builders import key_of, make_fact
from tests.support.inmemory import InMemoryMemoryd


def contents(bundle: ContextBundle) -> list[str]:
    return [r.fact.content for r in bundle.facts]


class DownIndex(InMemoryVectorIndex):
    """The vector index with its server gone: every read raises."""

    def query(self, **kwargs: object) -> list[VectorHit]:  # type: ignore[override,unused-ignore]
        raise VectorIndexUnavailable("chroma is down")

    def score(
        self, text: str, fact_ids: Sequence[uuid.UUID], n: int
    ) -> tuple[list[VectorHit], dict[uuid.UUID, Vector]]:
        raise VectorIndexUnavailable("chroma is down")

    def embeddings(self, fact_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Vector]:
        raise VectorIndexUnavailable("chroma is down")


@dataclass
class Observed:
    calls: list[tuple[ContextBundle, bool, RewriteOutcome | None]] = field(default_factory=list)

    def assembled(
        self, bundle: ContextBundle, cache_hit: bool, rewrite: RewriteOutcome | None
    ) -> None:
        self.calls.append((bundle, cache_hit, rewrite))


def test_a_new_user_gets_an_empty_valid_bundle() -> None:
    service = InMemoryMemoryd().context_service()
    bundle = service.assemble(key_of("nobody"), "what do I like?")
    service.close()
    assert (bundle.facts, bundle.degraded, bundle.memory_version) == ((), False, 0)
    assert "(nothing known yet)" in bundle.prompt_block


def test_relevant_facts_pinned_ones_always_and_nothing_of_other_users() -> None:
    m = InMemoryMemoryd()
    pinned = make_fact("ada", "Ada's daughter is Mia", pinned=True)
    m.seed("ada", [pinned, make_fact("ada", "Ada keeps bees on the roof")], working_memory="W")
    m.seed("bob", [make_fact("bob", "Bob keeps bees on the roof too")])
    service = m.context_service()
    bundle = service.assemble(key_of("ada"), "tell me about the bees")
    service.close()
    assert contents(bundle) == ["Ada's daughter is Mia", "Ada keeps bees on the roof"]
    assert [r.pinned for r in bundle.facts] == [True, False]
    assert bundle.working_memory == "W"


def test_connection_scoped_facts_need_their_connection() -> None:
    m = InMemoryMemoryd()
    m.seed(
        "ada",
        [make_fact("ada", "The Acme review is on Friday", connection_id="gmail")],
        connections={"gmail": ("Acme mails come from lena",)},
    )
    service = m.context_service()
    without = service.assemble(key_of("ada"), "when is the Acme review?", ["slack"])
    with_mail = service.assemble(key_of("ada"), "when is the Acme review?", ["gmail"])
    service.close()
    assert contents(without) == []
    assert contents(with_mail) == ["The Acme review is on Friday"]
    assert with_mail.connection_info == {"gmail": ("Acme mails come from lena",)}


def test_the_store_wins_over_a_lagging_index() -> None:
    m = InMemoryMemoryd()
    old = make_fact("ada", "Ada lives in Lisbon")
    m.seed("ada", [old, make_fact("ada", "Ada lives in Porto")])
    # The store says contradicted; the index still holds the fact as active.
    m.db.facts[old.fact_id] = replace(m.db.facts[old.fact_id], status=FactStatus.CONTRADICTED)
    service = m.context_service()
    bundle = service.assemble(key_of("ada"), "where does Ada live in Lisbon")
    service.close()
    assert contents(bundle) == ["Ada lives in Porto"]


def test_the_same_text_in_two_scopes_comes_back_once() -> None:
    m = InMemoryMemoryd()
    m.seed(
        "ada",
        [
            make_fact("ada", "Ada likes green tea"),
            make_fact("ada", "Ada likes  green tea", connection_id="mail"),
        ],
    )
    service = m.context_service()
    bundle = service.assemble(key_of("ada"), "green tea", ["mail"])
    service.close()
    assert len(bundle.facts) == 1


def test_with_the_index_down_the_bundle_comes_back_degraded() -> None:
    m = InMemoryMemoryd()
    m.seed("ada", [make_fact("ada", "Ada keeps bees on the roof")])
    service = m.context_service(index=DownIndex(m.embedder))
    bundle = service.assemble(key_of("ada"), "bees")
    service.close()
    assert bundle.degraded
    assert bundle.degraded_reason == "vector index unavailable: chroma is down"
    assert contents(bundle) == ["Ada keeps bees on the roof"]  # from the keyword search
    assert "(memory retrieval degraded: vector index unavailable" in bundle.prompt_block


def test_the_same_user_id_in_another_organization_is_another_memory() -> None:
    m = InMemoryMemoryd()
    m.seed("ada", [make_fact("ada", "Ada keeps bees")], org="org-a", working_memory="ours")
    theirs = make_fact("ada", "Ada keeps bees on a farm", org="org-b", pinned=True)
    m.seed("ada", [theirs], org="org-b", working_memory="theirs")
    service = m.context_service()
    ours = service.assemble(key_of("ada"), "bees")
    other = service.assemble(key_of("ada", "org-b"), "bees")
    nobody = service.assemble(key_of("ada", "org-c"), "bees")
    service.close()
    assert (contents(ours), ours.working_memory) == (["Ada keeps bees"], "ours")
    assert (contents(other), other.working_memory) == (["Ada keeps bees on a farm"], "theirs")
    assert {r.fact.organization_id for r in other.facts} == {"org-b"}
    assert (nobody.facts, nobody.memory_version, nobody.organization_id) == ((), 0, "org-c")


def test_the_audit_row_recalls_and_observer_get_every_turn() -> None:
    m = InMemoryMemoryd()
    bees = make_fact("ada", "Ada keeps bees on the roof")
    m.seed("ada", [bees])
    observed = Observed()
    service = m.context_service(observer=observed)
    first = service.assemble(key_of("ada"), "bees", budget=Budget.LEAN)
    second = service.assemble(key_of("ada"), "bees", log_id=first.log_id)  # a retried turn
    service.close()  # writes what the background writers hold

    assert [hit for _, hit, _ in observed.calls] == [False, True]  # the injection cache
    assert [rewrite for _, _, rewrite in observed.calls] == [None, None]
    (row,) = m.reads.context_logs(key_of("ada"))  # one row per log id
    assert row["log_id"] == first.log_id == second.log_id
    assert row["retrieved"][0]["fact_id"] == str(bees.fact_id)
    (stored,) = m.memory.facts_by_id([bees.fact_id])
    assert stored.recall_count == 1  # the retried turn counts its recalls once
    another = m.context_service()
    another.assemble(key_of("ada"), "bees")
    another.close()
    (stored,) = m.memory.facts_by_id([bees.fact_id])
    assert stored.recall_count == 2
