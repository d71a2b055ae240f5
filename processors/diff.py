"""Two memory images compared fact by fact: live memory against a fold or a shadow replay."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from domain.erasure import REDACTION
from domain.model import Fact
from processors.fold import FoldedMemory

# What a fact *says*; timestamps, versions and recall counters differ between any two runs.
DIFF_FIELDS = (
    "content",
    "fact_type",
    "surface",
    "status",
    "superseded_by",
    "pinned",
    "confidence",
    "salience",
    "reinforce_count",
    "event_date",
    "subject",
)
# The fold of a memory's own runs must give its live rows exactly: everything a run writes
# (`domain.upsert.RUN_OVERWRITES`), evidence and times included. Not recall counters or the
# index's stamp, which the read path and the indexer write outside runs.
VERIFY_FIELDS = (
    *DIFF_FIELDS,
    "source_event_ids",
    "observed_at",
    "last_reinforced_at",
    "updated_at",
    "version",
)


@dataclass(frozen=True)
class FactDiff:
    fact_id: uuid.UUID
    content: str
    fields: Mapping[str, tuple[Any, Any]]  # name → (left, right)


@dataclass(frozen=True)
class MemoryDiff:
    """`left` is the reference (live memory), `right` the image compared with it."""

    only_left: tuple[Fact, ...]
    only_right: tuple[Fact, ...]
    changed: tuple[FactDiff, ...]
    working_memory: tuple[str, str] | None
    scaffold: Mapping[str, tuple[Any, Any]]  # key → (left, right); None where absent
    learned_info: tuple[tuple[str, ...], tuple[str, ...]]  # (only left, only right)
    connections: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]
    # Only from an `exact` diff: the versions, when they differ, and the lists holding the same
    # entries in another order ("learned_info", or a connection's id).
    version: tuple[int, int] | None = None
    reordered: tuple[str, ...] = ()

    @property
    def identical(self) -> bool:
        return not (
            self.only_left
            or self.only_right
            or self.changed
            or self.working_memory
            or self.scaffold
            or any(self.learned_info)
            or self.connections
            or self.version
            or self.reordered
        )


def _comparable(fact: Fact, name: str) -> Any:
    value = getattr(fact, name) if hasattr(fact, name) else getattr(fact.provenance, name)
    if isinstance(value, tuple):
        return tuple(str(v) for v in value)
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, uuid.UUID):
        return str(value)
    return value.value if isinstance(value, StrEnum) else value


def _fact_diff(left: Fact, right: Fact, fields: Sequence[str]) -> FactDiff | None:
    fields_ = {
        name: (_comparable(left, name), _comparable(right, name))
        for name in fields
        if _comparable(left, name) != _comparable(right, name)
    }
    return FactDiff(left.fact_id, left.content, fields_) if fields_ else None


def _only(
    left: Sequence[str], right: Sequence[str], *, counted: bool
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What each side holds that the other does not; `counted`, an entry held twice on one
    side and once on the other is once in that side's share."""
    if not counted:
        return tuple(x for x in left if x not in right), tuple(x for x in right if x not in left)
    return _unmatched(left, right), _unmatched(right, left)


def _unmatched(items: Sequence[str], others: Sequence[str]) -> tuple[str, ...]:
    left = Counter(others)
    out = []
    for x in items:
        if left[x]:
            left[x] -= 1
        else:
            out.append(x)
    return tuple(out)


def diff_memory(
    left: FoldedMemory,
    right: FoldedMemory,
    fields: Sequence[str] = DIFF_FIELDS,
    *,
    exact: bool = False,
) -> MemoryDiff:
    """Facts are matched by id: UUID5 of (user, content, scope), the same in any namespace;
    `fields` are the fields of a fact compared.

    `exact` for an image that must be `left` itself (a fold of the memory's own runs): the
    versions are compared, and learned info and connection info as the lists they are stored
    as, repeats and order included. Otherwise (a shadow replay) they are compared as sets of
    entries: another model or batching may say a thing twice, or in another order."""
    lf, rf = left.facts, right.facts
    common = sorted(lf.keys() & rf.keys())
    changed = [d for fid in common if (d := _fact_diff(lf[fid], rf[fid], fields))]
    keys = sorted({*left.scaffold, *right.scaffold})
    scaffold = {
        k: (left.scaffold.get(k), right.scaffold.get(k))
        for k in keys
        if left.scaffold.get(k) != right.scaffold.get(k)
    }
    connections = {}
    reordered = []
    lists = [("learned_info", left.learned_info, right.learned_info)]
    for c in sorted({*left.connections, *right.connections}):
        a, b = left.connections.get(c, ()), right.connections.get(c, ())
        lists.append((c, a, b))
        if any(only := _only(a, b, counted=exact)):
            connections[c] = only
    for name, a, b in lists:
        if exact and tuple(a) != tuple(b) and not any(_only(a, b, counted=True)):
            reordered.append(name)
    return MemoryDiff(
        only_left=tuple(f for f in left.facts_in() if f.fact_id not in rf),
        only_right=tuple(f for f in right.facts_in() if f.fact_id not in lf),
        changed=tuple(changed),
        working_memory=None
        if left.working_memory == right.working_memory
        else (left.working_memory, right.working_memory),
        scaffold=scaffold,
        learned_info=_only(left.learned_info, right.learned_info, counted=exact),
        connections=connections,
        version=(left.version, right.version) if exact and left.version != right.version else None,
        reordered=tuple(reordered),
    )


NO_DIFFERENCE = MemoryDiff((), (), (), None, {}, ((), ()), {})


def split_erased(
    diff: MemoryDiff, live: FoldedMemory, erased: Collection[uuid.UUID]
) -> tuple[MemoryDiff, MemoryDiff]:
    """(what the shadow differs by, what a fact erasure explains) of a shadow replay's `diff`
    with live memory, the replay having left out `erased`, the events an erasure redacted.

    Live memory was written from those events' text, then redacted where the erased fact's
    text occurred; the shadow never read them. So once one is left out, a difference in W, S,
    learned or connection info is the erasure's, and so is a fact only live, or changed,
    whose evidence holds such an event or whose text holds the erasure's marker. A fact only
    in the shadow is not: nothing of live memory stands for it.
    """
    if not erased:
        return diff, NO_DIFFERENCE
    gone = {str(i) for i in erased}

    def explained(fact: Fact) -> bool:
        sources = {str(i) for i in fact.provenance.source_event_ids}
        return REDACTION in fact.content or not gone.isdisjoint(sources)

    changed = [d for d in diff.changed if explained(live.facts[d.fact_id])]
    erasure = MemoryDiff(
        only_left=tuple(f for f in diff.only_left if explained(f)),
        only_right=(),
        changed=tuple(changed),
        working_memory=diff.working_memory,
        scaffold=diff.scaffold,
        learned_info=diff.learned_info,
        connections=diff.connections,
    )
    rest = replace(
        NO_DIFFERENCE,
        only_left=tuple(f for f in diff.only_left if not explained(f)),
        only_right=diff.only_right,
        changed=tuple(d for d in diff.changed if d not in changed),
        version=diff.version,
        reordered=diff.reordered,
    )
    return rest, erasure
