"""Reading a LoCoMo-format file: the dialogue to ingest and, apart from it, the gold questions.

Only `conversation` is material for memoryd. `qa` is read for the questions and their
evidence turns; `observation`, `session_summary` and `event_summary` are never read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.locomo.metrics import CATEGORIES, normalize_dia_id, normalize_evidence

_SESSION = re.compile(r"session_(\d+)")
# "1:56 pm on 8 May, 2023"
SESSION_TIME_FORMAT = "%I:%M %p on %d %B, %Y"
# Other layouts of the same, seen in hand-made files; ISO 8601 is taken too.
_OTHER_TIME_FORMATS = ("%I:%M %p on %d %B %Y", "%I:%M %p on %B %d, %Y", "%d %B %Y", "%B %d, %Y")
MAX_TURN_CHARS = 8_000
# A user id is an event's: what the contract's identifiers allow.
_NOT_IN_AN_ID = re.compile(r"[^A-Za-z0-9_.:@\-]")
MAX_SAMPLE_ID_CHARS = 100


def parse_session_time(text: str) -> datetime:
    """A session's date_time, as UTC (the data gives no time zone); ValueError if no
    layout known reads it."""
    flat = " ".join(text.split())
    for layout in (SESSION_TIME_FORMAT, *_OTHER_TIME_FORMATS):
        try:
            return datetime.strptime(flat, layout).replace(tzinfo=UTC)
        except ValueError:
            continue
    parsed = datetime.fromisoformat(flat)
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Turn:
    dia_id: str
    session: int
    speaker: str
    text: str
    caption: str | None
    occurred_at: datetime

    @property
    def said(self) -> bool:
        """Whether the turn says anything (a photo shared says its caption)."""
        return bool(self.text.replace("\x00", "").strip() or self.caption)

    @property
    def content(self) -> str:
        """What is ingested: "Speaker: text", plus the image caption when a photo was shared.
        A turn without a speaker is the user's own (LongMemEval's user turns)."""
        line = f"{self.speaker}: {self.text}".strip() if self.speaker else self.text.strip()
        if self.caption:
            line += f" [shares a photo: {self.caption}]"
        # The event contract bounds content and refuses NUL: an assistant's essay is cut, a
        # NUL dropped, not the turn refused.
        return line.replace("\x00", "")[:MAX_TURN_CHARS]


@dataclass(frozen=True)
class Question:
    sample_id: str
    question: str
    category: int
    evidence: tuple[str, ...]  # normalized, each the id of a turn of the conversation
    raw_evidence: tuple[str, ...]


@dataclass(frozen=True)
class Conversation:
    sample_id: str
    turns: tuple[Turn, ...]
    questions: tuple[Question, ...]  # categories 1-4 with evidence left after normalizing
    skipped: dict[str, int]  # questions not asked, by reason
    # Turns not ingested, and sessions dated from the one before, by reason.
    turn_notes: dict[str, int] = field(default_factory=dict)


class Notes(dict[str, int]):
    """Counts by reason of what a file holds that the bench cannot use as it is."""

    def add(self, reason: str, n: int = 1) -> None:
        self[reason] = self.get(reason, 0) + n


def load(path: Path, limit: int | None = None) -> list[Conversation]:
    """A LoCoMo file (a list of conversations) or a LongMemEval one (a list of questions with
    their haystack sessions): the format is told by the items' keys."""
    from bench.locomo import longmemeval  # noqa: PLC0415 - it imports this module

    data = json.loads(path.read_text("utf-8"))
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a list of conversations")
    items = [item for item in (data if limit is None else data[:limit]) if isinstance(item, dict)]
    if not items:
        raise ValueError(f"{path}: no conversation (an object) in the list")
    conversations = [
        longmemeval.conversation(item, i)
        if longmemeval.is_longmemeval(item)
        else conversation(item, i)
        for i, item in enumerate(items)
    ]
    return _distinct_ids(conversations)


def sample_id_of(value: object, index: int) -> str:
    """A conversation's id as a user id: the contract's characters, bounded in length."""
    text = _NOT_IN_AN_ID.sub("_", str(value)) if value not in (None, "") else f"item-{index}"
    return text[:MAX_SAMPLE_ID_CHARS]


def _distinct_ids(conversations: list[Conversation]) -> list[Conversation]:
    """Two items of one id would be one user, their turns' events one event: the second
    gets the id with its position in the file."""
    seen: set[str] = set()
    out = []
    for i, conv in enumerate(conversations):
        kept = conv
        if conv.sample_id in seen:
            sample_id = f"{conv.sample_id[: MAX_SAMPLE_ID_CHARS - 8]}.{i}"
            kept = replace(
                conv,
                sample_id=sample_id,
                questions=tuple(replace(q, sample_id=sample_id) for q in conv.questions),
            )
        seen.add(kept.sample_id)
        out.append(kept)
    return out


def conversation(item: dict[str, Any], index: int = 0) -> Conversation:
    sample_id = sample_id_of(item.get("sample_id"), index)
    notes = Notes()
    turns = tuple(_turns(item.get("conversation") or {}, notes))
    known = {t.dia_id for t in turns}
    questions, skipped = [], Notes({"category 5 (adversarial)": 0, "no evidence turn": 0})
    for qa in item.get("qa") or []:
        question = _question(sample_id, qa, known)
        if isinstance(question, Question):
            questions.append(question)
        else:
            skipped.add(question)
    return Conversation(sample_id, turns, tuple(questions), dict(skipped), dict(notes))


def _question(sample_id: str, qa: Any, known: set[str]) -> Question | str:
    """The question, or why it is not asked."""
    try:
        category = int(qa["category"])
        text = str(qa["question"]).strip()
        evidence_field = qa.get("evidence") or []
    except (KeyError, TypeError, ValueError, AttributeError):
        return "malformed question (no category or question)"
    if category == 5:
        return "category 5 (adversarial)"
    if category not in CATEGORIES:
        return f"category {category} (not scored)"
    if not text:
        return "malformed question (no category or question)"
    listed = [evidence_field] if isinstance(evidence_field, str) else evidence_field
    raw = tuple(str(e) for e in listed) if isinstance(listed, list) else ()
    evidence = normalize_evidence(raw, known)
    if not evidence:
        return "no evidence turn"
    return Question(sample_id, text, category, evidence, raw)


def _turns(conv: dict[str, Any], notes: Notes) -> list[Turn]:
    sessions = sorted(int(m.group(1)) for key in conv if (m := _SESSION.fullmatch(key)) is not None)
    out: list[Turn] = []
    seen: set[str] = set()
    when = datetime(2000, 1, 1, tzinfo=UTC)  # before any session dated
    for n in sessions:
        try:
            when = parse_session_time(str(conv[f"session_{n}_date_time"]))
        except (KeyError, ValueError):
            notes.add("session without a readable date (dated as the one before)")
        turns = conv[f"session_{n}"]
        for raw in turns if isinstance(turns, list) else []:
            turn = _turn(raw, n, when)
            if isinstance(turn, str):
                notes.add(turn)
            elif turn.dia_id in seen:
                notes.add("turn id seen before in the conversation")
            else:
                seen.add(turn.dia_id)
                out.append(turn)
    return out


def _turn(raw: Any, session: int, when: datetime) -> Turn | str:
    """The turn, or why it is not ingested."""
    if not isinstance(raw, dict) or "text" not in raw or "speaker" not in raw:
        return "malformed turn (no text or speaker)"
    dia_id = normalize_dia_id(str(raw.get("dia_id", "")))
    if dia_id is None:
        return "turn id not D<session>:<turn>"
    caption = raw.get("blip_caption")
    turn = Turn(
        dia_id=dia_id,
        session=session,
        speaker=str(raw["speaker"]),
        text=str(raw["text"]),
        caption=str(caption) if caption else None,
        occurred_at=when,
    )
    return turn if turn.said else "empty turn"
