"""What of a shadow replay's diff a fact erasure explains, and what stays the shadow's."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from domain.erasure import REDACTION
from domain.model import Fact
from processors.diff import diff_memory, split_erased
from processors.fold import FoldedMemory
from tests.support.builders import make_fact

ERASED = uuid.uuid4()
KEPT = uuid.uuid4()


def memory(
    *facts: Fact,
    working_memory: str = "",
    scaffold: Mapping[str, Any] | None = None,
    learned_info: tuple[str, ...] = (),
) -> FoldedMemory:
    return FoldedMemory(
        user_id="ada",
        organization_id="org-a",
        working_memory=working_memory,
        scaffold=scaffold or {},
        learned_info=learned_info,
        facts={f.fact_id: f for f in facts},
    )


def test_an_erasure_explains_what_live_wrote_from_the_redacted_events() -> None:
    # Written from an event the erasure redacted (a twin of the erased fact's source), and
    # a fact the erasure redacted in place: live only.
    from_erased = make_fact("ada", "My office is in Lisbon", source_event_ids=(ERASED, KEPT))
    redacted = make_fact("ada", f"Moved to {REDACTION} in May", source_event_ids=(KEPT,))
    own = make_fact("ada", "I like jazz", source_event_ids=(KEPT,))  # the backend's to keep
    shadows = make_fact("ada", "I like tea", source_event_ids=(KEPT,))  # the shadow's alone
    changed = make_fact("ada", "I use Python", source_event_ids=(ERASED,))
    live = memory(
        from_erased,
        redacted,
        own,
        changed,
        working_memory=f"Lives in {REDACTION}.",
        scaffold={"Location": REDACTION},
        learned_info=(REDACTION,),
    )
    shadow = memory(shadows, replace(changed, confidence=0.5), working_memory="")
    diff = diff_memory(live, shadow)

    rest, by_erasure = split_erased(diff, live, [ERASED])
    assert [f.fact_id for f in by_erasure.only_left] == [
        f.fact_id for f in live.facts_in() if f in (from_erased, redacted)
    ]
    assert [d.fact_id for d in by_erasure.changed] == [changed.fact_id]
    assert by_erasure.working_memory == (f"Lives in {REDACTION}.", "")
    assert by_erasure.scaffold == {"Location": (REDACTION, None)}
    assert by_erasure.learned_info == ((REDACTION,), ())
    assert not by_erasure.only_right
    assert [f.fact_id for f in rest.only_left] == [own.fact_id]
    assert [f.fact_id for f in rest.only_right] == [shadows.fact_id]
    assert rest == replace(
        by_erasure,
        only_left=rest.only_left,
        only_right=rest.only_right,
        changed=(),
        working_memory=None,
        scaffold={},
        learned_info=((), ()),
    )

    # No event left out: nothing is the erasure's.
    rest, by_erasure = split_erased(diff, live, [])
    assert rest == diff
    assert by_erasure.identical
