"""A memory whose S is at its cap, in CJK, is still consolidated through Gemini.

The real SDK against the fake Gemini, which holds each answer to the request's
maxOutputTokens. S is filled to its cap by `scaffold_update` events (no model needed for
that), then an ordinary event comes. The stand-in model follows the prompt about S: the whole
object when asked for it, a merge patch when asked for that. An answer copying out an S of
some 19,000 CJK characters does not fit the room an answer has: every batch of that user
would end at MAX_TOKENS, be bisected and dead-lettered.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from html import unescape
from typing import Any

import pytest

from memoryd import wiring
from processors.schema import MAX_SCAFFOLD_CHARS, scaffold_size
from producers.contract import EventType, Source
from tests.support.builders import key_of, make_event
from tests.support.deployment import Deployment, gemini_backend, letter_count, tuned
from tests.support.fake_gemini import FakeGemini, FakeReply, RecordedRequest, output_tokens

pytestmark = pytest.mark.integration

# 4,800 CJK characters a key, four keys: S just under its cap.
NOTES = {f"Notes {i}": f"{i}:" + "東京の設計チームで働いています。" * 300 for i in range(4)}
_SCAFFOLD = re.compile(r"<scaffold>(.*)</scaffold>", re.DOTALL)


def follows_the_prompt(request: RecordedRequest) -> FakeReply:
    """Puts the start of each observation under "Latest", answering S as the prompt asks."""
    match = _SCAFFOLD.search(request.user_text)
    current: dict[str, Any] = json.loads(unescape(match.group(1))) if match else {}
    change = {"Latest": [text[:40] for _, text in request.observations]}
    patch = "merge patch" in request.system_text
    answer = {
        "updated_working_memory": "ユーザーは東京の設計チームで働いています。",
        "updated_scaffold": change if patch else {**current, **change},
        "facts": [],
    }
    # As a model writes it: CJK as characters, not \u escapes.
    text = json.dumps(answer, ensure_ascii=False)
    return FakeReply.text(text, completion_tokens=output_tokens(text), thoughts_tokens=500)


@pytest.fixture
def fake() -> Iterator[FakeGemini]:
    with FakeGemini(responder=follows_the_prompt) as server:
        yield server


def test_a_user_whose_cjk_scaffold_is_at_its_cap_is_still_consolidated(
    deployment: Deployment, fake: FakeGemini
) -> None:
    deployment = tuned(deployment, backoff_base_s=0.05, max_attempts=3)
    fill = [
        make_event(
            "ada", json.dumps(value, ensure_ascii=False), EventType.SCAFFOLD_UPDATE,
            source=Source.AUTONOMOUS, scaffold_key=key, minutes=i,
        )
        for i, (key, value) in enumerate(NOTES.items())
    ]  # fmt: skip
    deployment.publish(fill)
    with gemini_backend(fake.url) as backend:
        deployment.run_processor(backend)

    def scaffold(c: wiring.Core) -> dict[str, Any]:
        return dict(c.memory.load_state(key_of("ada")).scaffold)

    filled = deployment.with_core(scaffold)
    assert {k: filled[k] for k in NOTES} == NOTES
    assert MAX_SCAFFOLD_CHARS - 1_000 < scaffold_size(filled) <= MAX_SCAFFOLD_CHARS

    later = [
        make_event("ada", "来月、大阪に引っ越します。", minutes=10),
        make_event("ada", "新しいプロジェクトを始めました。", minutes=11),
    ]
    deployment.publish(later)
    with gemini_backend(fake.url) as backend:
        deployment.run_processor(backend)

    statuses = deployment.query("SELECT status FROM consolidation_runs ORDER BY seq")
    assert {s for (s,) in statuses} == {"succeeded"}, "no answer cut at MAX_TOKENS"
    assert len(fake.requests) == len(statuses)
    after = deployment.with_core(scaffold)
    assert after["Latest"] == [e.content for e in later]
    assert {k: after[k] for k in NOTES} == NOTES
    consumed = {r[0] for r in deployment.query("SELECT event_id FROM consolidated_events")}
    assert {e.event_id for e in later} <= consumed
    k = deployment.settings.kafka
    assert letter_count(k.bootstrap_servers, k.dead_letter_topic) == 0
