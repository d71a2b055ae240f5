"""Reading a LoCoMo-format file: the dialogue to ingest and, apart from it, the gold questions.

Only `conversation` is material for memoryd. `qa` is read for the questions and their
evidence turns; `observation`, `session_summary` and `event_summary` are never read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.locomo.metrics import CATEGORIES, normalize_dia_id, normalize_evidence

_SESSION = re.compile(r"session_(\d+)")
# "1:56 pm on 8 May, 2023"
SESSION_TIME_FORMAT = "%I:%M %p on %d %B, %Y"
MAX_TURN_CHARS = 8_000


def parse_session_time(text: str) -> datetime:
    """A session's date_time, as UTC (the data gives no time zone)."""
    return datetime.strptime(" ".join(text.split()), SESSION_TIME_FORMAT).replace(tzinfo=UTC)


@dataclass(frozen=True)
class Turn:
    dia_id: str
    session: int
    speaker: str
    text: str
    caption: str | None
    occurred_at: datetime

    @property
    def content(self) -> str:
        """What is ingested: "Speaker: text", plus the image caption when a photo was shared.
        A turn without a speaker is the user's own (LongMemEval's user turns)."""
        line = f"{self.speaker}: {self.text}".strip() if self.speaker else self.text.strip()
        # The event contract bounds content; an assistant's essay is cut, not refused.
        line = line[:MAX_TURN_CHARS]
        if self.caption:
            line += f" [shares a photo: {self.caption}]"
        return line


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


def load(path: Path, limit: int | None = None) -> list[Conversation]:
    """A LoCoMo file (a list of conversations) or a LongMemEval one (a list of questions with
    their haystack sessions): the format is told by the items' keys."""
    from bench.locomo import longmemeval  # noqa: PLC0415 - it imports this module

    data = json.loads(path.read_text("utf-8"))
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a list of conversations")
    items = data if limit is None else data[:limit]
    return [
        longmemeval.conversation(item) if longmemeval.is_longmemeval(item) else conversation(item)
        for item in items
    ]


def conversation(item: dict[str, Any]) -> Conversation:
    sample_id = str(item["sample_id"])
    turns = tuple(_turns(item["conversation"]))
    known = {t.dia_id for t in turns}
    questions, skipped = [], {"category 5 (adversarial)": 0, "no evidence turn": 0}
    for qa in item.get("qa", []):
        category = int(qa["category"])
        if category not in CATEGORIES:
            skipped["category 5 (adversarial)"] += 1
            continue
        raw = tuple(str(e) for e in qa.get("evidence", []))
        evidence = normalize_evidence(raw, known)
        if not evidence:
            skipped["no evidence turn"] += 1
            continue
        questions.append(Question(sample_id, str(qa["question"]), category, evidence, raw))
    return Conversation(sample_id, turns, tuple(questions), skipped)


def _turns(conv: dict[str, Any]) -> list[Turn]:
    sessions = sorted(int(m.group(1)) for key in conv if (m := _SESSION.fullmatch(key)) is not None)
    out: list[Turn] = []
    for n in sessions:
        when = parse_session_time(conv[f"session_{n}_date_time"])
        for raw in conv[f"session_{n}"]:
            dia_id = normalize_dia_id(str(raw["dia_id"]))
            if dia_id is None:
                raise ValueError(f"session {n}: turn id {raw['dia_id']!r} is not D<s>:<t>")
            caption = raw.get("blip_caption")
            out.append(
                Turn(
                    dia_id=dia_id,
                    session=n,
                    speaker=str(raw["speaker"]),
                    text=str(raw["text"]),
                    caption=str(caption) if caption else None,
                    occurred_at=when,
                )
            )
    return out
