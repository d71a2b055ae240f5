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

from bench.locomo.dataset import Conversation, Notes, Question, Turn, sample_id_of

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
OTHER_TYPE = 19  # a question_type not above


def is_longmemeval(item: dict[str, Any]) -> bool:
    return "haystack_sessions" in item


def parse_date(text: str) -> datetime:
    return datetime.strptime(" ".join(text.split()), DATE_FORMAT).replace(tzinfo=UTC)


def conversation(item: dict[str, Any], index: int = 0) -> Conversation:
    sample_id = sample_id_of(item.get("question_id"), index)
    turns: list[Turn] = []
    evidence: list[str] = []
    notes = Notes()
    sessions = item.get("haystack_sessions") or []
    dates = item.get("haystack_dates") or []
    when = datetime(2000, 1, 1, tzinfo=UTC)  # before any session dated
    for n, session in enumerate(sessions, start=1):
        try:
            when = parse_date(str(dates[n - 1]))
        except (IndexError, ValueError):
            notes.add("session without a readable date (dated as the one before)")
        for t, raw in enumerate(session if isinstance(session, list) else [], start=1):
            if not isinstance(raw, dict) or "content" not in raw:
                notes.add("malformed turn (no content)")
                continue
            dia_id = f"D{n}:{t}"
            role = str(raw.get("role", "user"))
            turn = Turn(
                dia_id=dia_id,
                session=n,
                speaker="" if role == "user" else role.capitalize(),
                text=str(raw["content"]),
                caption=None,
                occurred_at=when,
            )
            if not turn.said:
                notes.add("empty turn")
                continue
            turns.append(turn)
            if raw.get("has_answer"):
                evidence.append(dia_id)
    category = QUESTION_TYPES.get(str(item.get("question_type", "")), OTHER_TYPE)
    question = str(item.get("question") or "").strip()
    skipped = Notes({"no evidence turn": 0})
    questions: tuple[Question, ...] = ()
    if sample_id.endswith("_abs"):
        # An abstention question asks for what the haystack does not hold: nothing to find,
        # so LongMemEval's retrieval metrics leave them out too.
        skipped.add("abstention (nothing to retrieve)")
    elif not question:
        skipped.add("malformed question (no category or question)")
    elif evidence:
        ev = tuple(evidence)
        questions = (Question(sample_id, question, category, ev, ev),)
    else:
        skipped.add("no evidence turn")
    return Conversation(sample_id, tuple(turns), questions, dict(skipped), dict(notes))
