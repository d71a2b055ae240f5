"""The LoCoMo bench reads any file of the two formats it takes: what it cannot use is left out
and counted, never a crash after an hour of ingest, and every turn it keeps is an event the
contract takes."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.locomo.__main__ import json_summary
from bench.locomo.baselines import Bm25Turns
from bench.locomo.dataset import MAX_TURN_CHARS, conversation, load
from bench.locomo.ingest import IngestReport, turn_event


def _turn(dia_id: str, text: str = "Hi!", **extra: Any) -> dict[str, Any]:
    return {"speaker": "Ann", "dia_id": dia_id, "text": text, **extra}


ODD_LOCOMO: dict[str, Any] = {
    "sample_id": "conv 7/α",  # not an identifier as it stands
    "conversation": {
        "session_1_date_time": "1:56 pm on 8 May 2023",  # no comma
        "session_1": [
            _turn("D1:1"),
            _turn("D1:1", "said twice"),  # an id seen before
            _turn("D1:x"),  # no id
            {"speaker": "Bo", "dia_id": "D1:3"},  # no text
            _turn("D1:4", "   "),  # nothing to say
            _turn("D1:5", "long " * 2_000, blip_caption="a cat"),
            _turn("D1:6", "a NUL\x00 inside"),
        ],
        "session_2": [_turn("D2:1", "No date for this session.")],
    },
    "qa": [
        {"question": "q1", "evidence": "D1:5", "category": 1},  # a bare string
        {"question": "q2", "evidence": None, "category": 2},
        {"question": "q3", "evidence": ["D2:1"], "category": 6},
        {"evidence": ["D1:1"], "category": 4},  # no question
        {"question": "q5", "evidence": ["D1:1"], "category": "four"},
        {"question": "q6", "answer": 42, "evidence": ["D1:6"], "category": 4},
    ],
}


def test_an_odd_locomo_conversation_is_read_with_what_it_cannot_use_counted() -> None:
    conv = conversation(ODD_LOCOMO)
    assert conv.sample_id == "conv_7__"
    assert [t.dia_id for t in conv.turns] == ["D1:1", "D1:5", "D1:6", "D2:1"]
    assert conv.turns[0].occurred_at == datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    assert conv.turns[-1].occurred_at == conv.turns[0].occurred_at  # dated as the one before
    assert conv.turn_notes == {
        "turn id seen before in the conversation": 1,
        "turn id not D<session>:<turn>": 1,
        "malformed turn (no text or speaker)": 1,
        "empty turn": 1,
        "session without a readable date (dated as the one before)": 1,
    }
    assert [(q.question, q.evidence) for q in conv.questions] == [
        ("q1", ("D1:5",)),
        ("q6", ("D1:6",)),
    ]
    assert conv.skipped == {
        "category 5 (adversarial)": 0,
        "no evidence turn": 1,
        "category 6 (not scored)": 1,
        "malformed question (no category or question)": 2,
    }
    for turn in conv.turns:  # each an event the contract takes
        event = turn_event(conv.sample_id, turn)
        assert 0 < len(event.content) <= MAX_TURN_CHARS
        assert "\x00" not in event.content


def test_items_of_one_id_are_two_users(tmp_path: Path) -> None:
    path = tmp_path / "twice.json"
    path.write_text(json.dumps([ODD_LOCOMO, ODD_LOCOMO, {"qa": []}]))
    ids = [c.sample_id for c in load(path)]
    assert ids == ["conv_7__", "conv_7__.1", "item-2"]


def _longmemeval(question_id: str, **changes: Any) -> dict[str, Any]:
    item = {
        "question_id": question_id,
        "question_type": "single-session-user",
        "question": "Where did I move?",
        "haystack_dates": ["2023/05/20 (Sat) 02:21"],
        "haystack_sessions": [
            [
                {"role": "user", "content": "I moved to Porto.", "has_answer": True},
                {"role": "assistant", "content": ""},
                {"role": "user"},
            ],
            [{"role": "user", "content": "Thanks!"}],
        ],
    }
    return {**item, **changes}


def test_longmemeval_items_without_dates_types_or_answers_to_find_are_read(
    tmp_path: Path,
) -> None:
    path = tmp_path / "lme.json"
    items = [
        _longmemeval("q1"),
        _longmemeval("q2_abs"),  # abstention: nothing to retrieve
        _longmemeval("q3", question_type="new-kind", haystack_dates=[]),
    ]
    path.write_text(json.dumps(items))
    first, abstention, odd = load(path)
    assert [t.content for t in first.turns] == ["I moved to Porto.", "Thanks!"]
    assert first.turn_notes == {
        "empty turn": 1,
        "malformed turn (no content)": 1,
        "session without a readable date (dated as the one before)": 1,
    }
    assert [q.evidence for q in first.questions] == [("D1:1",)]
    assert abstention.questions == ()
    assert abstention.skipped["abstention (nothing to retrieve)"] == 1
    assert [q.category for q in odd.questions] == [19]  # "other question type"


def test_bm25_over_turns_no_word_of_which_it_reads_ranks_them_in_order() -> None:
    conv = conversation(
        {
            "sample_id": "ru",
            "conversation": {
                "session_1_date_time": "1:56 pm on 8 May, 2023",
                "session_1": [_turn("D1:1", "Привет!"), _turn("D1:2", "Как дела?")],
            },
        }
    )
    assert Bm25Turns(conv.turns).search("Как?", 2) == ["D1:1", "D1:2"]


def test_a_run_that_asked_no_question_still_writes_its_json() -> None:
    report = IngestReport(0, 0, {}, {}, 0, 0.0, 0.0)
    document = json_summary(report, [])
    assert (document["questions"], document["overall"], document["facts_per_turn"]) == (0, {}, 0)
