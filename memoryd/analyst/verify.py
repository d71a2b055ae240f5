"""`memoryd replay verify`: fold each memory's run log and compare it with live memory.

The run log is the derived event log: folding it must give what the live tables hold. A
difference means a write that bypassed the runs, a lost run, or a bug in the fold; a fold
error means the log itself is broken (out of order, a version gap). Either way the command
exits non-zero, so it can run from cron or CI against a replica.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from domain.ids import MemoryKey
from domain.model import LoggedRun
from memoryd.analyst.render import diff_json
from processors.diff import VERIFY_FIELDS, MemoryDiff, diff_memory
from processors.fold import FoldedMemory, FoldError, fold_runs


@dataclass(frozen=True)
class Verification:
    key: MemoryKey
    runs: int
    diff: MemoryDiff | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.diff is not None and self.diff.identical


def verify_memory(key: MemoryKey, runs: list[LoggedRun], live: FoldedMemory) -> Verification:
    start = FoldedMemory(user_id=key.user_id, organization_id=key.organization_id)
    try:
        folded = fold_runs(runs, start)
    except FoldError as e:
        return Verification(key, len(runs), None, str(e))
    return Verification(key, len(runs), diff_memory(live, folded, VERIFY_FIELDS, exact=True))


def verification_json(v: Verification) -> dict[str, Any]:
    return {
        "organization_id": v.key.organization_id,
        "user_id": v.key.user_id,
        "runs": v.runs,
        "ok": v.ok,
        "error": v.error,
        "diff": None if v.diff is None or v.diff.identical else diff_json(v.diff),
    }


def render_verification(v: Verification) -> str:
    who = str(v.key)
    if v.error is not None:
        return f"FOLD ERROR {who}: {v.error}"
    if v.ok:
        return f"ok  {who}: {v.runs} run(s) fold to live memory"
    d = v.diff
    assert d is not None
    parts = [
        f"{len(d.only_left)} fact(s) only live",
        f"{len(d.only_right)} only folded",
        f"{len(d.changed)} changed",
    ]
    if d.version is not None:
        parts.append(f"version live={d.version[0]} folded={d.version[1]}")
    if d.working_memory is not None:
        parts.append("working memory differs")
    if d.scaffold:
        parts.append(f"scaffold keys differ: {', '.join(sorted(d.scaffold))}")
    if any(d.learned_info):
        parts.append("learned info differs")
    if d.connections:
        parts.append(f"connections differ: {', '.join(sorted(d.connections))}")
    if d.reordered:
        parts.append(f"in another order: {', '.join(d.reordered)}")
    lines = [f"DIFF {who}: {'; '.join(parts)}"]
    for fd in d.changed:
        lines.extend(
            f"    {fd.fact_id} {k}: live={a!r} folded={b!r}" for k, (a, b) in fd.fields.items()
        )
    return "\n".join(lines)
