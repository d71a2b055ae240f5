"""What a run's write of a fact does to the fact already stored: the one definition.

The Postgres upsert (`store.fact_rows`) builds its `SET` list from `RUN_OVERWRITES`, and
`merge_fact` (used by the replay fold and the in-memory store) builds the merged value from
the same names, so the live row and the folded fact cannot drift apart.
"""

from __future__ import annotations

from dataclasses import fields, replace
from datetime import datetime
from typing import Any

import numpy as np

from domain.model import Fact, Provenance

# The columns a run overwrites. The rest of the row keeps what it had: identity, scope and
# origin (user, organization, connection, tool, message...), pinning, the read path's recall
# counters, and when and by which run the fact was first created. `version` counts writes,
# and a changed fact is pending for the vector index again.
RUN_OVERWRITES = (
    "content",
    "source_event_ids",
    "fact_type",
    "surface",
    "status",
    "confidence",
    "salience",
    "reinforce_count",
    "last_reinforced_at",
    "superseded_by",
    "updated_at",
    "observed_at",
    "event_date",
    "subject",
)

_PROVENANCE = frozenset(f.name for f in fields(Provenance))


def as_stored(fact: Fact) -> Fact:
    """The fact as the store gives it back: confidence and salience are Postgres `real`
    columns, read back as the shortest decimal of their 32-bit value."""
    return replace(fact, confidence=_real(fact.confidence), salience=_real(fact.salience))


def merge_fact(stored: Fact | None, after: Fact) -> Fact:
    """What the store holds once a run writes `after` over `stored` (None: a new fact).

    A pinned fact is never changed by a run.
    """
    after = as_stored(after)
    if stored is None:
        return after
    if stored.pinned:
        return stored
    on_fact: dict[str, Any] = {}
    on_provenance: dict[str, Any] = {}
    for name in RUN_OVERWRITES:
        if name in _PROVENANCE:
            on_provenance[name] = getattr(after.provenance, name)
        else:
            on_fact[name] = getattr(after, name)
    return replace(
        stored,
        **on_fact,
        provenance=replace(stored.provenance, **on_provenance),
        indexed_at=None,
        version=stored.version + 1,
    )


def _real(value: float) -> float:
    return float(str(np.float32(value)))


def written_as(fact: Fact) -> tuple[int, datetime, str]:
    """What tells apart two texts of a fact the vector index may hold: its version and time,
    and its content, which an erasure of a fact it quotes redacts keeping both."""
    return fact.version, fact.updated_at, fact.content
