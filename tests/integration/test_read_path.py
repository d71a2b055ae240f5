"""The read path on real Postgres and Chroma: scope, status truth, policies, budgets, audit."""

from __future__ import annotations

import pytest

from domain.model import FactStatus, SurfacePolicy
from memoryd import wiring
from memoryd.settings import ChromaSettings
from store.read.bundle import ContextBundle
from store.read.context_service import ContextService
from store.read.injection import InjectionCache
from store.read.memory_changes import APPLICATION, watching
from store.read.ranking import PROFILES, Budget
from store.read.rendering import SurfaceGroup, group_facts
from tests.support.builders import key_of, make_fact
from tests.support.deployment import Deployment, seed_core, wait_until

pytestmark = pytest.mark.integration


def contents(bundle: ContextBundle) -> list[str]:
    return [r.fact.content for r in bundle.facts]


def test_facts_never_cross_users_or_organizations(deployment: Deployment) -> None:
    def check(c: wiring.Core) -> None:
        seed_core(c, "ada", [make_fact("ada", "Ada takes her coffee black")], org="org-a")
        # Better matches for the query, owned by someone else: another user of the same
        # organization, and the same user id in another organization, pinned there.
        dessert = "The favourite dessert is tiramisu from the bakery on Rua Augusta"
        seed_core(c, "bob", [make_fact("bob", dessert)], org="org-a")
        other_ada = make_fact("ada", dessert, org="org-b", pinned=True)
        seed_core(c, "ada", [other_ada], org="org-b", working_memory="org-b's Ada bakes.")
        assert other_ada.fact_id != make_fact("ada", dessert).fact_id
        with wiring.read_path(c) as service:
            for budget in Budget:
                bundle = service.assemble(key_of("ada"), dessert, budget=budget)
                assert {(r.fact.organization_id, r.fact.user_id) for r in bundle.facts} <= {
                    ("org-a", "ada")
                }
                assert dessert not in bundle.prompt_block
                assert "bakes" not in bundle.prompt_block
            theirs = service.assemble(key_of("ada", "org-b"), dessert)
            assert [r.fact.fact_id for r in theirs.facts] == [other_ada.fact_id]
            assert theirs.working_memory == "org-b's Ada bakes."
            nobody = service.assemble(key_of("eve"), dessert)  # eve is in no org-a memory
            assert (nobody.facts, nobody.memory_version) == ((), 0)

    deployment.with_core(check)


def test_a_connection_scoped_fact_appears_only_with_its_connection(
    deployment: Deployment,
) -> None:
    def check(c: wiring.Core) -> None:
        seed_core(
            c,
            "ada",
            [
                make_fact("ada", "The Acme quarterly review is on Friday", connection_id="gmail"),
                make_fact("ada", "Ada prefers morning meetings"),
            ],
            connections={"gmail": ("Acme emails come from lena@acme.example",)},
        )
        with wiring.read_path(c) as service:
            without = service.assemble(key_of("ada"), "When is the Acme review?")
            other = service.assemble(key_of("ada"), "When is the Acme review?", ["slack"])
            with_mail = service.assemble(
                key_of("ada"), "When is the Acme review?", ["gmail", "slack"]
            )
        assert not any("Acme" in x for x in contents(without) + contents(other))
        assert "lena@acme.example" not in without.prompt_block
        assert any("Acme quarterly review" in x for x in contents(with_mail))
        assert with_mail.connection_info == {"gmail": ("Acme emails come from lena@acme.example",)}
        assert "[gmail] Acme emails come from lena@acme.example" in with_mail.prompt_block

    deployment.with_core(check)


def test_contradicted_facts_never_appear_even_when_chroma_lags(deployment: Deployment) -> None:
    old, new = "Ada lives in Lisbon", "Ada lives in Porto"

    def check(c: wiring.Core) -> None:
        seed_core(c, "ada", [make_fact("ada", old), make_fact("ada", new)])
        # Postgres says contradicted; Chroma still holds the fact as active.
        with c.pool.connection() as conn:
            conn.execute(
                "UPDATE memory_facts SET status = 'contradicted' WHERE content = %s", (old,)
            )
        with wiring.read_path(c) as service:
            for budget in Budget:
                bundle = service.assemble(
                    key_of("ada"), "Where does Ada live? Lisbon?", budget=budget
                )
                assert old not in contents(bundle)
                assert new in contents(bundle)
            audit = service.assemble(
                key_of("ada"), "Lisbon", statuses=(FactStatus.ACTIVE, FactStatus.CONTRADICTED)
            )
        assert old in contents(audit)  # only when asked for

    deployment.with_core(check)


def test_a_fact_changed_under_a_cached_memory_is_never_shown_and_counters_are_fresh(
    deployment: Deployment,
) -> None:
    """A turn ranks on its memory's cached rows and reads the picked ones' versions and recall
    counters back from Postgres: a row changed without a new memory stamp (a run racing the
    turn) sends the turn back to rank on Postgres's rows, and what is shown carries the
    current recall counters."""
    old, new = "Ada lives in Lisbon", "Ada lives in Porto"
    question = "Where does Ada live? Lisbon?"

    def check(c: wiring.Core) -> None:
        seed_core(c, "ada", [make_fact("ada", old), make_fact("ada", new)])
        with wiring.read_path(c) as service:
            assert old in contents(service.assemble(key_of("ada"), question))
            entry = c.dense_cache.get(key_of("ada"))
            with c.pool.connection() as conn:
                conn.execute(
                    "UPDATE memory_facts SET status = 'contradicted', version = version + 1"
                    " WHERE content = %s",
                    (old,),
                )
                conn.execute(
                    "UPDATE memory_facts SET recall_count = recall_count + 1000 WHERE content = %s",
                    (new,),
                )
            for budget in Budget:
                bundle = service.assemble(key_of("ada"), question, budget=budget)
                assert old not in contents(bundle)
                recalls = {r.fact.content: r.fact.recall_count for r in bundle.facts}
                assert recalls[new] >= 1000
            assert entry is not None
            assert c.dense_cache.get(key_of("ada")) is entry

    deployment.with_core(check)


def test_pinned_in_always_and_avoid_never_relevant(deployment: Deployment) -> None:
    def check(c: wiring.Core) -> None:
        seed_core(
            c,
            "ada",
            [
                make_fact("ada", "Ada is allergic to peanuts", pinned=True),
                make_fact("ada", "Ada is going through a divorce", surface=SurfacePolicy.AVOID),
                make_fact("ada", "Ada's divorce lawyer is Mr Smith", surface=SurfacePolicy.AVOID),
                make_fact("ada", "Ada prefers short answers", surface=SurfacePolicy.ADAPT),
                make_fact("ada", "Ada was comparing CRM vendors", surface=SurfacePolicy.CONTINUE),
                make_fact("ada", "Ada's team ships Falcon in December"),
            ],
        )
        with wiring.read_path(c) as service:
            bundle = service.assemble(key_of("ada"), "Any advice about my divorce and the team?")
        groups = group_facts(bundle.facts)
        assert [r.fact.content for r in groups[SurfaceGroup.ALWAYS_KNOWN]] == [
            "Ada is allergic to peanuts"
        ]
        assert all(r.fact.surface is not SurfacePolicy.AVOID for r in groups[SurfaceGroup.RELEVANT])
        assert any("divorce" in r.fact.content for r in groups[SurfaceGroup.AVOID])
        block = bundle.prompt_block
        avoid_at = block.index("Do not surface unless the user does:")
        assert block.index("Ada is going through a divorce") > avoid_at
        for header in ("# Your Context", "Structured Data:", "Learned Info:"):
            assert header in block

    deployment.with_core(check)


def test_budgets_keyword_search_and_near_duplicates(deployment: Deployment) -> None:
    paraphrases = [
        "Ada works at Initech as a product designer",
        "Ada is a product designer at Initech",
        "Ada's job: product designer, Initech",
        "At Initech, Ada works as a product designer",
    ]
    others = [f"Ada visited city number {i} on a trip in {2000 + i}" for i in range(20)]

    def check(c: wiring.Core) -> None:
        facts = [make_fact("ada", x) for x in paraphrases + others]
        facts.append(make_fact("ada", "Invoice INV-4411 from Acme totals 12,400 EUR"))
        facts.append(make_fact("ada", "Ada's manager at Initech is Grace"))
        seed_core(c, "ada", facts)
        with wiring.read_path(c) as service:
            returned = {
                b: contents(service.assemble(key_of("ada"), "Ada trip city visited", budget=b))
                for b in Budget
            }
            lean = service.assemble(
                key_of("ada"), "Where does Ada work at Initech?", budget=Budget.LEAN
            )
            keyword = service.assemble(key_of("ada"), "INV-4411", budget=Budget.LEAN)
        # Each budget is a number of characters filled in rank order, within its fact counts.
        for budget, texts in returned.items():
            profile = PROFILES[budget]
            assert profile.min_facts <= len(texts) <= profile.max_facts
            assert sum(map(len, texts)) <= (profile.max_chars or 0)
        assert len(returned[Budget.LEAN]) < len(returned[Budget.BALANCED])
        assert len(returned[Budget.BALANCED]) <= len(returned[Budget.DEEP])
        # MMR: the four paraphrases do not take every slot from the manager fact.
        assert sum(x in paraphrases for x in contents(lean)) <= 2
        assert "Ada's manager at Initech is Grace" in contents(lean)
        assert contents(keyword)[0].startswith("Invoice INV-4411")
        assert keyword.facts[0].keyword_rank == 1

    deployment.with_core(check)


def test_chroma_down_still_answers_from_keywords_degraded(deployment: Deployment) -> None:
    deployment.with_core(
        lambda c: seed_core(c, "ada", [make_fact("ada", "Invoice INV-4411 totals 12,400 EUR")])
    )
    dead = deployment.settings.model_copy(
        update={"chroma": ChromaSettings(mode="http", url="http://127.0.0.1:9")}
    )
    with wiring.core(dead) as c, wiring.read_path(c) as service:
        bundle = service.assemble(key_of("ada"), "What about invoice INV-4411?")
    assert bundle.degraded
    assert "unavailable" in (bundle.degraded_reason or "")
    assert contents(bundle) == ["Invoice INV-4411 totals 12,400 EUR"]


def test_audit_rows_and_recall_counters_are_written_off_the_hot_path(
    deployment: Deployment,
) -> None:
    def check(c: wiring.Core) -> ContextService:
        seed_core(c, "ada", [make_fact("ada", "Ada lives in Porto", pinned=True)], org="org-a")
        seed_core(c, "ada", [make_fact("ada", "Ada's bike is a green Brompton")], org="org-a")
        with wiring.read_path(c) as service:
            first = service.assemble(key_of("ada"), "What bike does Ada ride?")
            service.assemble(key_of("ada"), "Tell me about the Brompton bike")
            service.assemble(key_of("ada"), "Tell me about the Brompton bike", log_id=first.log_id)
        return service

    deployment.with_core(check)
    logs = deployment.query(
        "SELECT user_id, organization_id, memory_version, degraded, budget, retrieved, injected"
        " FROM context_logs ORDER BY created_at"
    )
    assert len(logs) == 2  # the third repeated the first's log id
    user, org, version, degraded, budget, retrieved, injected = logs[0]
    assert (user, org, version, degraded, budget) == ("ada", "org-a", 2, False, "balanced")
    assert {r["fact_id"] for r in retrieved} >= {r["fact_id"] for r in retrieved if r["pinned"]}
    assert any(r["pinned"] for r in retrieved)
    assert all({"score", "similarity", "dense_rank", "keyword_rank"} <= r.keys() for r in retrieved)
    assert injected["pinned_fact_ids"]
    assert injected["prompt_sha256"]
    recalls = dict(
        deployment.query("SELECT content, recall_count FROM memory_fact_rows WHERE user_id = 'ada'")
    )
    # Two turns: the third retried the first and counts nothing again.
    assert recalls == {"Ada lives in Porto": 2, "Ada's bike is a green Brompton": 2}
    assert deployment.query(
        "SELECT count(*) FROM memory_fact_rows WHERE last_recalled_at IS NULL"
    ) == [(0,)]


def test_injection_is_cached_per_memory_version(deployment: Deployment) -> None:
    def check(c: wiring.Core) -> None:
        seed_core(c, "ada", [], working_memory="Ada designs billing screens.")
        with wiring.read_path(c) as service:
            first = service.assemble(key_of("ada"), "hi")
            second = service.assemble(key_of("ada"), "hi")
            seed_core(c, "ada", [], working_memory="Ada moved to the payments team.")
            # The read path trusts the stamp it read until the change is announced to it
            # (milliseconds after the commit): the new version comes within that.
            wait_until(
                lambda: service.assemble(key_of("ada"), "hi").memory_version > first.memory_version,
                5.0,
                "the new version announced",
            )
            third = service.assemble(key_of("ada"), "hi")
        assert first.working_memory == second.working_memory == "Ada designs billing screens."
        assert third.working_memory == "Ada moved to the payments team."
        assert third.memory_version == first.memory_version + 1

    deployment.with_core(check)


def test_a_watched_stamp_holds_until_a_commit_anywhere_announces_a_change(
    deployment: Deployment,
) -> None:
    """No stamp round trip while nothing changed; a new version, a new generation (erasure)
    or a removed memory committed by any process is announced and read again; a lost
    listening connection trusts nothing until it is back."""
    ada = key_of("ada")

    def check(c: wiring.Core) -> None:
        seed_core(c, "ada", [], working_memory="Ada designs billing screens.")
        reads = wiring.read_model(c)
        with watching(c.settings.postgres.dsn, 30.0, 100) as watch:
            assert watch is not None
            wait_until(lambda: watch.reading() is not None, 10.0, "the listener listening")
            cache = InjectionCache(reads, watch=watch)
            first, _ = cache.get(ada)
            assert watch.current(ada) == first.stamp
            assert cache.get(ada) == (first, True)
            for change in (
                lambda: seed_core(c, "ada", [], working_memory="Ada moved to payments."),
                lambda: deployment.query(
                    "UPDATE user_memory SET generation = gen_random_uuid() WHERE user_id = 'ada'"
                    " RETURNING 1"
                ),
                lambda: deployment.query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = %s",
                    (APPLICATION,),
                ),
                lambda: deployment.query(
                    "DELETE FROM user_memory WHERE user_id = 'ada' RETURNING 1"
                ),
            ):
                wait_until(lambda: watch.reading() is not None, 10.0, "listening")
                before, _ = cache.get(ada)
                assert watch.current(ada) == before.stamp
                change()
                wait_until(lambda: watch.current(ada) is None, 5.0, "the change announced")
            assert cache.get(ada)[0].generation is None  # the memory is gone

    deployment.with_core(check)


def test_context_type_filter(deployment: Deployment) -> None:
    def check(c: wiring.Core) -> None:
        seed_core(
            c,
            "ada",
            [
                make_fact("ada", "Invoice 4411 totals 12,400 EUR", context_type="tool_output"),
                make_fact("ada", "Ada thinks invoice 4411 is too high"),
            ],
        )
        with wiring.read_path(c) as service:
            both = service.assemble(key_of("ada"), "invoice 4411")
            tools = service.assemble(key_of("ada"), "invoice 4411", context_types=["tool_output"])
        assert len(both.facts) == 2
        assert contents(tools) == ["Invoice 4411 totals 12,400 EUR"]

    deployment.with_core(check)
