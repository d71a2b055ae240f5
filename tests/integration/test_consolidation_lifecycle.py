"""Facts over time, batch after batch: a correction supersedes, a paraphrase reinforces.

Each step is its own processor run, so every later batch is planned against the facts the
earlier runs stored: the offline backend, and Gemini (the fake) told the stored fact's id.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from domain.model import Fact, FactStatus, TokenUsage
from memoryd import wiring
from processors.schema import (
    BackendResponse,
    ConsolidationOutput,
    ConsolidationRequest,
    FactOp,
    FactProposal,
)
from producers.contract import EventType
from tests.support.builders import key_of, make_event
from tests.support.deployment import Deployment, gemini_backend
from tests.support.fake_gemini import FakeGemini, FakeReply

pytestmark = pytest.mark.integration


@pytest.fixture
def fake() -> Iterator[FakeGemini]:
    with FakeGemini() as server:
        yield server


def all_facts(deployment: Deployment, user_id: str) -> list[Fact]:
    def read(c: wiring.Core) -> list[Fact]:
        return c.memory.facts(key_of(user_id), tuple(FactStatus))

    result: list[Fact] = deployment.with_core(read)
    return result


def retrieved(deployment: Deployment, user_id: str, query: str) -> list[str]:
    def ask(c: wiring.Core) -> list[str]:
        with wiring.read_path(c) as service:
            bundle = service.assemble(key_of(user_id), query)
        return [r.fact.content for r in bundle.facts]

    result: list[str] = deployment.with_core(ask)
    return result


def assert_superseded(facts: list[Fact], old_word: str, new_word: str) -> Fact:
    [old] = [f for f in facts if old_word in f.content.lower()]
    [new] = [f for f in facts if new_word in f.content.lower()]
    assert old.status is FactStatus.CONTRADICTED
    assert old.superseded_by == new.fact_id
    assert new.status is FactStatus.ACTIVE
    return new


def test_a_later_correction_supersedes_the_fact_offline(deployment: Deployment) -> None:
    deployment.publish([make_event("ada", "I work in engineering", minutes=0)])
    deployment.run_processor()
    [first] = all_facts(deployment, "ada")
    assert first.status is FactStatus.ACTIVE

    correction = make_event("ada", "Actually I moved to design", EventType.CORRECTION, minutes=60)
    deployment.publish([correction])
    deployment.run_processor()

    facts = all_facts(deployment, "ada")
    assert len(facts) == 2
    new = assert_superseded(facts, "engineering", "design")
    assert correction.event_id in new.provenance.source_event_ids
    found = retrieved(deployment, "ada", "Which team does the user work in?")
    assert found == [new.content]
    [(scaffold,)] = deployment.query(
        "SELECT information_scaffold FROM user_memory WHERE user_id = 'ada'"
    )
    assert "design" in scaffold["Role"].lower()
    assert "engineering" not in json.dumps(scaffold).lower()
    # Two runs, and the history shows the contradiction with the fact as it was before.
    history = deployment.query(
        "SELECT operation, before->>'status', after->>'status' FROM fact_history"
        " WHERE fact_id = %s ORDER BY id",
        (first.fact_id,),
    )
    assert history == [("add", None, "active"), ("contradict", "active", "contradicted")]


def gemini_answer(memory: str, scaffold: dict[str, Any], facts: list[dict[str, Any]]) -> Any:
    return {"updated_working_memory": memory, "updated_scaffold": scaffold, "facts": facts}


def proposal(op: str, content: str, target: uuid.UUID | None = None) -> dict[str, Any]:
    return {
        "op": op,
        "content": content,
        "type": "profile",
        "confidence": 0.9,
        "salience": 0.8,
        "surface": "speak",
        "target_fact_id": None if target is None else str(target),
        "evidence": ["E1"],
    }


def test_gemini_contradicts_the_stored_fact_by_id(deployment: Deployment, fake: FakeGemini) -> None:
    fake.reply(
        FakeReply.json(
            gemini_answer(
                "Ada works in engineering.",
                {"Role": "Engineer"},
                [proposal("add", "The user works in engineering.")],
            )
        )
    )
    deployment.publish([make_event("ada", "I work in engineering", minutes=0)])
    with gemini_backend(fake.url) as backend:
        deployment.run_processor(backend)
    [first] = all_facts(deployment, "ada")

    # The model only knows the fact's id because the request listed the active facts.
    fake.reply(
        FakeReply.json(
            gemini_answer(
                "Ada moved to the design team.",
                {"Role": "Designer"},
                [proposal("contradict", "The user works in design.", target=first.fact_id)],
            )
        )
    )
    correction = make_event("ada", "Actually I moved to design", EventType.CORRECTION, minutes=60)
    deployment.publish([correction])
    with gemini_backend(fake.url) as backend:
        deployment.run_processor(backend)

    assert len(fake.requests) == 2
    assert f'<fact id="{first.fact_id}"' in fake.requests[1].user_text
    assert "Actually I moved to design" in fake.requests[1].user_text
    new = assert_superseded(all_facts(deployment, "ada"), "engineering", "design")
    assert retrieved(deployment, "ada", "Which team does the user work in?") == [new.content]
    [(scaffold,)] = deployment.query(
        "SELECT information_scaffold FROM user_memory WHERE user_id = 'ada'"
    )
    assert scaffold["Role"] == "Designer"


def test_one_fact_said_three_ways_is_one_fact_reinforced_twice(deployment: Deployment) -> None:
    for minutes, text in enumerate(
        ["I live in Berlin", "I am based in Berlin", "I reside in Berlin"]
    ):
        deployment.publish([make_event("bo", text, minutes=minutes * 60)])
        deployment.run_processor()

    facts = all_facts(deployment, "bo")
    assert len(facts) == 1, [(f.content, f.status) for f in facts]
    [fact] = facts
    assert fact.status is FactStatus.ACTIVE
    assert "berlin" in fact.content.lower()
    assert fact.reinforce_count == 2
    assert len(fact.provenance.source_event_ids) == 3
    assert [r[0] for r in deployment.query("SELECT status FROM consolidation_runs")] == [
        "succeeded"
    ] * 3


class PinsWhileThinking:
    """A backend that proposes an update to a fact, while someone pins that fact meanwhile
    (an operator, through the API): the run was planned on the unpinned fact."""

    name = "scripted"
    model = "scripted-v1"
    prompt_version = "scripted-v1"

    def __init__(self, deployment: Deployment) -> None:
        self._deployment = deployment

    def consolidate(self, request: ConsolidationRequest) -> BackendResponse:
        [target] = request.active_facts
        assert not target.pinned
        with psycopg.connect(self._deployment.dsn) as conn:
            conn.execute("UPDATE memory_facts SET pinned = true WHERE fact_id = %s",
                         (target.fact_id,))  # fmt: skip
        output = ConsolidationOutput(
            updated_working_memory="Ada works in design.",
            facts=[
                FactProposal(
                    op=FactOp.UPDATE, content="The user works in design.",
                    target_fact_id=str(target.fact_id),
                )
            ],
        )  # fmt: skip
        return BackendResponse(output, "{}", TokenUsage(), self.model)


def test_a_fact_pinned_during_a_run_is_left_alone_and_no_history_claims_otherwise(
    deployment: Deployment,
) -> None:
    deployment.publish([make_event("ada", "I work in engineering", minutes=0)])
    deployment.run_processor()
    [before] = all_facts(deployment, "ada")

    deployment.publish([make_event("ada", "Actually I moved to design", minutes=60)])
    deployment.run_processor(PinsWhileThinking(deployment))

    [after] = all_facts(deployment, "ada")
    assert after.pinned
    assert (after.content, after.version) == (before.content, before.version)
    history = deployment.query(
        "SELECT operation FROM fact_history WHERE fact_id = %s ORDER BY id", (before.fact_id,)
    )
    assert history == [("add",)]
    # The run itself succeeded: W moved on, only the pinned fact refused the change.
    assert [r[0] for r in deployment.query("SELECT status FROM consolidation_runs")] == [
        "succeeded",
        "succeeded",
    ]
