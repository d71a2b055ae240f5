"""The system-prompt block the agent gets on every turn."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from store.context_service import ContextBundle


def render_prompt_block(bundle: ContextBundle) -> str:
    parts = ["# Your Context", bundle.working_memory.strip() or "(nothing known yet)"]
    parts += [
        "",
        "Structured Data:",
        json.dumps(bundle.scaffold, indent=2, ensure_ascii=False, sort_keys=True),
    ]
    learned = list(bundle.learned_info)
    for connection_id, info in sorted(bundle.connection_info.items()):
        learned += [f"[{connection_id}] {line}" for line in info]
    parts += ["", "Learned Info:"]
    parts += [f"- {line}" for line in learned] or ["(none)"]
    parts += ["", "Relevant Retrieved Facts:"]
    parts += [f"- {'[pinned] ' if r.pinned else ''}{r.fact.content}" for r in bundle.facts] or [
        "(none)"
    ]
    if bundle.degraded:
        parts += ["", f"(memory retrieval degraded: {bundle.degraded_reason})"]
    return "\n".join(parts)
