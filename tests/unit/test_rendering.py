"""Surface policies in the prompt block: which group a fact lands in, and the headers."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from domain.model import Fact, SurfacePolicy
from store.read.bundle import ContextBundle, RetrievedFact
from store.read.rendering import SurfaceGroup, group_facts, render_prompt_block, surface_group
from tests.support.builders import make_fact

NOW = datetime(2026, 11, 1, tzinfo=UTC)


def fact(content: str, surface: SurfacePolicy) -> Fact:
    return make_fact("ada", content, at=NOW, surface=surface)


def retrieved(content: str, surface: SurfacePolicy, pinned: bool = False) -> RetrievedFact:
    return RetrievedFact(fact(content, surface), 0.8, 0.5, pinned=pinned)


@pytest.mark.parametrize(
    ("surface", "pinned", "group"),
    [
        (SurfacePolicy.SPEAK, False, SurfaceGroup.RELEVANT),
        (SurfacePolicy.FACTCHECK, False, SurfaceGroup.RELEVANT),
        (SurfacePolicy.ADAPT, False, SurfaceGroup.USE_SILENTLY),
        (SurfacePolicy.AVOID, False, SurfaceGroup.AVOID),
        (SurfacePolicy.CONTINUE, False, SurfaceGroup.CONTINUE),
        (SurfacePolicy.SPEAK, True, SurfaceGroup.ALWAYS_KNOWN),
        (SurfacePolicy.ADAPT, True, SurfaceGroup.ALWAYS_KNOWN),
        # Pinned or not, a fact the user does not want raised is never volunteered.
        (SurfacePolicy.AVOID, True, SurfaceGroup.AVOID),
    ],
)
def test_surface_group(surface: SurfacePolicy, pinned: bool, group: SurfaceGroup) -> None:
    assert surface_group(retrieved("x", surface, pinned)) == group


def bundle(facts: list[RetrievedFact], degraded: str | None = None) -> ContextBundle:
    b = ContextBundle(
        organization_id="org-a",
        user_id="ada",
        memory_version=3,
        working_memory="Ada is a designer.",
        scaffold={"Role": "Designer"},
        learned_info=("Her manager is Grace",),
        connection_info={"gmail-work": ("Acme review on Fridays",)},
        facts=tuple(facts),
        degraded=degraded is not None,
        degraded_reason=degraded,
        latency_ms=1.0,
    )
    return replace(b, prompt_block=render_prompt_block(b))


def section(block: str, heading: str) -> list[str]:
    lines = block.splitlines()
    start = lines.index(heading) + 1
    out = []
    for line in lines[start:]:
        if not line.startswith("- "):
            break
        out.append(line)
    return out


def test_prompt_block_groups_facts_under_their_policy() -> None:
    block = bundle(
        [
            retrieved("Ada's daughter is called Mia", SurfacePolicy.SPEAK, pinned=True),
            retrieved("Ada is going through a divorce", SurfacePolicy.AVOID),
            retrieved("Falcon ships on December 15", SurfacePolicy.SPEAK),
            retrieved("Ada prefers short answers", SurfacePolicy.ADAPT),
            retrieved("Ada was comparing two CRM vendors", SurfacePolicy.CONTINUE),
            retrieved("Invoice 4411 totals 12,400 EUR", SurfacePolicy.FACTCHECK),
        ]
    ).prompt_block
    for header in ("# Your Context", "Structured Data:", "Learned Info:"):
        assert header in block
    assert "- [gmail-work] Acme review on Fridays" in block
    facts = block.split("Relevant Retrieved Facts:\n", 1)[1]
    assert section(facts, "Always known:") == ["- Ada's daughter is called Mia"]
    assert section(facts, "Relevant for this turn:") == [
        "- Falcon ships on December 15",
        "- Invoice 4411 totals 12,400 EUR (check before relying on it)",
    ]
    assert section(facts, "Use silently (let these shape the answer; do not mention them):") == [
        "- Ada prefers short answers"
    ]
    assert section(facts, "Do not surface unless the user does:") == [
        "- Ada is going through a divorce"
    ]
    assert section(facts, "Threads to continue:") == ["- Ada was comparing two CRM vendors"]
    # The groups come in a fixed order.
    order = [facts.index(h) for h in ("Always known:", "Relevant for this turn:", "Threads to")]
    assert order == sorted(order)


def test_an_avoid_fact_is_never_in_the_relevant_group() -> None:
    items = [retrieved(f"avoid {i}", SurfacePolicy.AVOID, pinned=i % 2 == 0) for i in range(4)]
    groups = group_facts(items)
    assert groups[SurfaceGroup.RELEVANT] == []
    assert groups[SurfaceGroup.ALWAYS_KNOWN] == []
    assert groups[SurfaceGroup.AVOID] == items


def test_empty_groups_are_left_out_and_no_facts_says_none() -> None:
    block = bundle([]).prompt_block
    assert block.endswith("Relevant Retrieved Facts:\n(none)")
    assert "Always known:" not in block


def test_degraded_is_said_in_the_block() -> None:
    block = bundle([], degraded="vector index unavailable: down").prompt_block
    assert "(memory retrieval degraded: vector index unavailable: down)" in block
