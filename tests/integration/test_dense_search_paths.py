"""Dense retrieval scores a user's few facts exactly, and many through Chroma's filtered ANN.

Both paths must agree on what is relevant and respect the same scope.
"""

from __future__ import annotations

import pytest

from memoryd import wiring
from producers.contract import EventType
from store.read import context_service
from store.read.ranking import Budget
from tests.support.builders import key_of, make_event
from tests.support.deployment import Deployment

pytestmark = pytest.mark.integration

OBSERVATIONS = [
    ("I keep bees on the roof of my building", EventType.FACT),
    ("My daughter Lina starts school in January", EventType.FACT),
    ("I drink espresso, never after 2pm", EventType.PREFERENCE),
    ("I am migrating the settlement ledger from MySQL to Postgres", EventType.PROJECT_DETAILS),
    ("I am allergic to peanuts", EventType.FACT),
]


def test_exact_and_ann_dense_paths_agree(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = [
        make_event("omar", text, kind, minutes=i) for i, (text, kind) in enumerate(OBSERVATIONS)
    ]
    events.append(make_event("other", "I keep bees and sell honey", minutes=9))
    deployment.publish(events)
    deployment.run_both()

    def top_facts(c: wiring.Core) -> list[str]:
        with wiring.read_path(c) as service:
            bundle = service.assemble(key_of("omar"), "beekeeping honey hives", budget=Budget.LEAN)
        assert not bundle.degraded
        assert all(r.fact.user_id == "omar" for r in bundle.facts)
        return [r.fact.content for r in bundle.facts]

    exact = deployment.with_core(top_facts)
    monkeypatch.setattr(context_service, "EXACT_SEARCH_MAX_FACTS", 0)
    ann = deployment.with_core(top_facts)
    assert "bees" in exact[0]
    assert exact[0] == ann[0]
