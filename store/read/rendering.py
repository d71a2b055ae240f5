"""The system-prompt block the agent gets on every turn.

Retrieved facts are grouped by how the agent may use them (their surface policy), so the
model is told, not left to guess, which facts to mention, which to only let shape its answer,
and which to keep quiet about unless the user raises them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import Protocol, TypeVar

from domain.model import Fact, SurfacePolicy
from store.read.bundle import ContextBundle
from store.read.scaffold_json import indented_json


class SurfaceGroup(StrEnum):
    ALWAYS_KNOWN = "always known"
    RELEVANT = "relevant for this turn"
    USE_SILENTLY = "use silently"
    AVOID = "do not surface unless the user does"
    CONTINUE = "threads to continue"


HEADINGS = {
    SurfaceGroup.ALWAYS_KNOWN: "Always known:",
    SurfaceGroup.RELEVANT: "Relevant for this turn:",
    SurfaceGroup.USE_SILENTLY: "Use silently (let these shape the answer; do not mention them):",
    SurfaceGroup.AVOID: "Do not surface unless the user does:",
    SurfaceGroup.CONTINUE: "Threads to continue:",
}


class Placed(Protocol):
    @property
    def fact(self) -> Fact: ...

    @property
    def pinned(self) -> bool: ...


T = TypeVar("T", bound=Placed)


def surface_group(item: Placed) -> SurfaceGroup:
    """Where a fact goes. `avoid` wins over pinning: a pinned fact the user does not want
    raised is still never volunteered."""
    surface = item.fact.surface
    if surface is SurfacePolicy.AVOID:
        return SurfaceGroup.AVOID
    if item.pinned:
        return SurfaceGroup.ALWAYS_KNOWN
    if surface is SurfacePolicy.ADAPT:
        return SurfaceGroup.USE_SILENTLY
    if surface is SurfacePolicy.CONTINUE:
        return SurfaceGroup.CONTINUE
    return SurfaceGroup.RELEVANT  # speak, factcheck


def group_facts(items: Iterable[T]) -> dict[SurfaceGroup, list[T]]:
    """Every group, in rendering order, each keeping the items' order."""
    groups: dict[SurfaceGroup, list[T]] = {g: [] for g in SurfaceGroup}
    for item in items:
        groups[surface_group(item)].append(item)
    return groups


def _line(item: Placed) -> str:
    content = " ".join(item.fact.content.split())
    if item.fact.surface is SurfacePolicy.FACTCHECK:
        return f"- {content} (check before relying on it)"
    return f"- {content}"


def render_facts(items: Sequence[Placed]) -> list[str]:
    lines: list[str] = []
    for group, members in group_facts(items).items():
        if members:
            lines += [HEADINGS[group], *(_line(m) for m in members)]
    return lines or ["(none)"]


def render_prompt_block(bundle: ContextBundle) -> str:
    parts = ["# Your Context", bundle.working_memory.strip() or "(nothing known yet)"]
    parts += [
        "",
        "Structured Data:",
        indented_json(bundle.scaffold),
    ]
    learned = list(bundle.learned_info)
    for connection_id, info in sorted(bundle.connection_info.items()):
        learned += [f"[{connection_id}] {line}" for line in info]
    parts += ["", "Learned Info:"]
    parts += [f"- {line}" for line in learned] or ["(none)"]
    parts += ["", "Relevant Retrieved Facts:", *render_facts(bundle.facts)]
    if bundle.degraded:
        parts += ["", f"(memory retrieval degraded: {bundle.degraded_reason})"]
    return "\n".join(parts)
