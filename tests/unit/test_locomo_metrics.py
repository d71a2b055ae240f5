"""The LoCoMo bench's pure parts: evidence ids, hit@k, recall@k, aggregation, data reading."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bench.locomo.dataset import conversation, parse_session_time
from bench.locomo.metrics import (
    OVERALL,
    Answer,
    covered,
    hit_at_k,
    hit_within,
    markdown_table,
    normalize_dia_id,
    normalize_evidence,
    recall_at_k,
    summarize,
)

KNOWN = {"D1:3", "D4:4", "D4:6", "D8:6", "D9:1", "D9:17", "D11:26", "D30:5"}


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ("D8:6", "D8:6"),
        ("  D8:6 ", "D8:6"),
        ("D:11:26", "D11:26"),  # stray colon after the D
        ("D30:05", "D30:5"),  # zero-padded turn
        ("D01:003", "D1:3"),
        ("D", None),
        ("", None),
        ("D8", None),
        ("8:6", None),
        ("D8:6:1", None),
        ("session 8", None),
    ],
)
def test_normalize_dia_id(token: str, expected: str | None) -> None:
    assert normalize_dia_id(token) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (["D8:6"], ("D8:6",)),
        (["D8:6; D9:17"], ("D8:6", "D9:17")),  # several ids in one string
        (["D9:1 D4:4 D4:6"], ("D9:1", "D4:4", "D4:6")),
        (["D9:1,D4:4"], ("D9:1", "D4:4")),
        (["D:11:26", "D30:05"], ("D11:26", "D30:5")),
        (["D"], ()),
        (["D99:1"], ()),  # points at no turn
        (["D8:6", "D99:1"], ("D8:6",)),
        (["D8:6", "D8:06", "D8:6"], ("D8:6",)),  # duplicates collapse, first order kept
        ([], ()),
    ],
)
def test_normalize_evidence(raw: list[str], expected: tuple[str, ...]) -> None:
    assert normalize_evidence(raw, KNOWN) == expected


RANKED = (frozenset({"a"}), frozenset({"b", "c"}), frozenset(), frozenset({"d"}))


@pytest.mark.parametrize(
    ("k", "evidence", "hit", "recall"),
    [
        (1, {"a"}, 1.0, 1.0),
        (1, {"b"}, 0.0, 0.0),
        (2, {"b"}, 1.0, 1.0),
        (2, {"a", "c", "x"}, 1.0, 2 / 3),
        (3, {"d"}, 0.0, 0.0),  # the empty third position covers nothing
        (4, {"d", "x"}, 1.0, 0.5),
        (10, {"a", "b", "c", "d"}, 1.0, 1.0),  # a list shorter than k is scored as it is
        (10, {"x"}, 0.0, 0.0),
    ],
)
def test_hit_and_recall_at_k(k: int, evidence: set[str], hit: float, recall: float) -> None:
    assert hit_at_k(RANKED, evidence, k) == hit
    assert recall_at_k(RANKED, evidence, k) == pytest.approx(recall)


@pytest.mark.parametrize(
    ("k", "expected"),
    [(1, {"a"}), (2, {"a", "b", "c"}), (3, {"a", "b", "c"}), (9, {"a", "b", "c", "d"})],
)
def test_covered(k: int, expected: set[str]) -> None:
    assert covered(RANKED, k) == expected


def test_empty_ranking_finds_nothing() -> None:
    assert hit_at_k((), {"a"}, 5) == 0.0
    assert recall_at_k((), {"a"}, 5) == 0.0


@pytest.mark.parametrize("fn", [hit_at_k, recall_at_k])
def test_question_without_evidence_is_refused(fn: object) -> None:
    with pytest.raises(ValueError, match="without evidence"):
        fn(RANKED, set(), 1)  # type: ignore[operator]


def test_k_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="k must be"):
        covered(RANKED, 0)


def _answer(system: str, category: int, evidence: tuple[str, ...], *turns: str) -> Answer:
    return Answer(system, category, evidence, tuple(frozenset({t}) for t in turns))


def test_summarize_means_per_category_and_overall() -> None:
    answers = [
        _answer("s", 1, ("a", "b"), "a", "x", "b"),  # multi-hop
        _answer("s", 1, ("c",), "x", "y", "z"),  # multi-hop, miss
        _answer("s", 4, ("d",), "d"),  # single-hop, list of one
        _answer("t", 4, ("d",), "x", "d"),
    ]
    rows = {(s.system, s.group): s for s in summarize(answers, ks=(1, 3))}
    multi = rows[("s", "multi-hop")]
    assert multi.questions == 2
    assert multi.hit == {1: 0.5, 3: 0.5}
    assert multi.recall == {1: 0.25, 3: 0.5}
    assert multi.turns == {1: 1.0, 3: 3.0}
    overall = rows[("s", OVERALL)]
    assert overall.questions == 3
    assert overall.hit == {1: pytest.approx(2 / 3), 3: pytest.approx(2 / 3)}
    assert overall.turns[3] == pytest.approx(7 / 3)
    assert rows[("t", "single-hop")].hit == {1: 0.0, 3: 1.0}
    order = [(s.system, s.group) for s in summarize(answers, ks=(1,))]
    assert order == [
        ("s", "multi-hop"),
        ("s", "single-hop"),
        ("s", OVERALL),
        ("t", "single-hop"),
        ("t", OVERALL),
    ]


def test_markdown_table() -> None:
    assert markdown_table(["name", "n"], [["a", 1], ["b", 22]], left=1) == (
        "| name | n |\n|---|--:|\n| a | 1 |\n| b | 22 |"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1:56 pm on 8 May, 2023", datetime(2023, 5, 8, 13, 56, tzinfo=UTC)),
        ("12:09 am on 13 September, 2023", datetime(2023, 9, 13, 0, 9, tzinfo=UTC)),
        ("10:37 am on 27 June,  2023", datetime(2023, 6, 27, 10, 37, tzinfo=UTC)),
    ],
)
def test_parse_session_time(text: str, expected: datetime) -> None:
    assert parse_session_time(text) == expected


def test_conversation_reads_turns_and_cleans_questions() -> None:
    item = {
        "sample_id": "conv-x",
        "conversation": {
            "speaker_a": "Ann",
            "speaker_b": "Bo",
            "session_2_date_time": "9:00 am on 2 May, 2023",
            "session_2": [{"speaker": "Bo", "dia_id": "D2:1", "text": "Later."}],
            "session_1_date_time": "1:56 pm on 1 May, 2023",
            "session_1": [
                {"speaker": "Ann", "dia_id": "D1:1", "text": "Hi!"},
                {
                    "speaker": "Bo",
                    "dia_id": "D1:2",
                    "text": "Look.",
                    "img_url": ["http://example.invalid/x.jpg"],
                    "blip_caption": "a photo of a cat",
                },
            ],
        },
        "qa": [
            {"question": "q1", "answer": "a", "evidence": ["D1:2; D2:1"], "category": 1},
            {"question": "q2", "answer": "a", "evidence": ["D7:1"], "category": 4},
            {"question": "q3", "adversarial_answer": "a", "evidence": ["D1:1"], "category": 5},
            {"question": "q4", "answer": "a", "evidence": [], "category": 2},
        ],
        "observation": {"must": "never be read"},
    }
    conv = conversation(item)
    assert [t.dia_id for t in conv.turns] == ["D1:1", "D1:2", "D2:1"]  # sessions in order
    assert conv.turns[1].content == "Bo: Look. [shares a photo: a photo of a cat]"
    assert conv.turns[0].content == "Ann: Hi!"
    assert conv.turns[2].occurred_at == datetime(2023, 5, 2, 9, 0, tzinfo=UTC)
    assert [(q.question, q.evidence) for q in conv.questions] == [("q1", ("D1:2", "D2:1"))]
    assert conv.skipped == {"category 5 (adversarial)": 1, "no evidence turn": 2}


@pytest.mark.parametrize(
    ("sizes", "budget", "hit"),
    [
        ((1_500, 400, 100), 2_000, 1.0),  # the evidence (third) fits: 2,000 exactly
        ((1_500, 600, 100), 2_000, 0.0),  # the second overflows and ends the list
        ((2_100, 10, 10), 2_000, 0.0),  # not even the first fits
    ],
)
def test_hit_within_a_character_budget(sizes: tuple[int, ...], budget: int, hit: float) -> None:
    ranked = [frozenset({"D1:1"}), frozenset({"D1:2"}), frozenset({"D1:3"})]
    assert hit_within(ranked, sizes, ["D1:3"], budget) == hit
