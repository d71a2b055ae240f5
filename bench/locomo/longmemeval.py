"""LongMemEval's format read as a conversation: one question's haystack sessions, in order.

A LongMemEval item holds one question and the chat sessions behind it (`haystack_sessions`,
dated by `haystack_dates`, e.g. "2023/05/25 (Thu) 20:21"); the turns that hold the answer are
marked `has_answer`. Each item becomes one conversation (user = its `question_id`) whose
evidence is those turns. The user's turns are ingested as the user's own words (no speaker
prefix: their "I" is the user); the assistant's as "Assistant: …".
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from bench.locomo.dataset import Conversation, Question, Turn

DATE_FORMAT = "%Y/%m/%d (%a) %H:%M"
# LongMemEval's question types, numbered after LoCoMo's categories so both can share a table.
QUESTION_TYPES: dict[str, int] = {
    "single-session-user": 11,
    "single-session-assistant": 12,
    "single-session-preference": 13,
    "multi-session": 14,
    "temporal-reasoning": 15,
    "knowledge-update": 16,
}


def is_longmemeval(item: dict[str, Any]) -> bool:
    return "haystack_sessions" in item and "question" in item


def parse_date(text: str) -> datetime:
    return datetime.strptime(" ".join(text.split()), DATE_FORMAT).replace(tzinfo=UTC)


def conversation(item: dict[str, Any]) -> Conversation:
    sample_id = str(item["question_id"])
    turns: list[Turn] = []
    evidence: list[str] = []
    sessions = item["haystack_sessions"]
    dates = item.get("haystack_dates") or []
    for n, session in enumerate(sessions, start=1):
        when = parse_date(dates[n - 1]) if n - 1 < len(dates) else parse_date(dates[-1])
        for t, raw in enumerate(session, start=1):
            dia_id = f"D{n}:{t}"
            role = str(raw["role"])
            turns.append(
                Turn(
                    dia_id=dia_id,
                    session=n,
                    speaker="" if role == "user" else role.capitalize(),
                    text=str(raw["content"]),
                    caption=None,
                    occurred_at=when,
                )
            )
            if raw.get("has_answer"):
                evidence.append(dia_id)
    kind = str(item.get("question_type", ""))
    category = QUESTION_TYPES.get(kind, 0)
    questions: tuple[Question, ...] = ()
    skipped = {"no evidence turn": 0}
    if evidence:
        ev = tuple(evidence)
        questions = (Question(sample_id, str(item["question"]), category, ev, ev),)
    else:
        skipped["no evidence turn"] = 1
    return Conversation(sample_id, tuple(turns), questions, skipped)
