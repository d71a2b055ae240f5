"""Relative time expressions resolved against the time they were said, table-driven."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from processors.time_expressions import Precision, resolve

# Monday 8 May 2023, 13:56 UTC: a LoCoMo session's time.
SAID = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "rewritten", "start", "precision"),
    [
        (
            "I went to a support group yesterday",
            "I went to a support group on 7 May 2023",
            date(2023, 5, 7),
            Precision.DAY,
        ),
        (
            "We watched it last night",
            "We watched it on 7 May 2023",
            date(2023, 5, 7),
            Precision.DAY,
        ),
        (
            "I got it the day before yesterday",
            "I got it on 6 May 2023",
            date(2023, 5, 6),
            Precision.DAY,
        ),
        ("I start today", "I start on 8 May 2023", date(2023, 5, 8), Precision.DAY),
        ("The show is tonight", "The show is on 8 May 2023", date(2023, 5, 8), Precision.DAY),
        ("I fly out tomorrow", "I fly out on 9 May 2023", date(2023, 5, 9), Precision.DAY),
        (
            "I ran a race last Saturday",
            "I ran a race on 6 May 2023",
            date(2023, 5, 6),
            Precision.DAY,
        ),
        ("We met this past Friday", "We met on 5 May 2023", date(2023, 5, 5), Precision.DAY),
        (
            "The party is next Friday",
            "The party is on 12 May 2023",
            date(2023, 5, 12),
            Precision.DAY,
        ),
        (
            "The recital is this Sunday",
            "The recital is on 14 May 2023",
            date(2023, 5, 14),
            Precision.DAY,
        ),
        (
            "We are going camping next month",
            "We are going camping in June 2023",
            date(2023, 6, 1),
            Precision.MONTH,
        ),
        ("I was sick last month", "I was sick in April 2023", date(2023, 4, 1), Precision.MONTH),
        ("I am busy this month", "I am busy in May 2023", date(2023, 5, 1), Precision.MONTH),
        ("I painted that last year", "I painted that in 2022", date(2022, 1, 1), Precision.YEAR),
        ("I graduate next year", "I graduate in 2024", date(2024, 1, 1), Precision.YEAR),
        ("Since last year I have run", "Since 2022 I have run", date(2022, 1, 1), Precision.YEAR),
        ("I moved two weeks ago", "I moved around 24 April 2023", date(2023, 4, 24), Precision.DAY),
        (
            "I called her a few days ago",
            "I called her around 5 May 2023",
            date(2023, 5, 5),
            Precision.DAY,
        ),
        ("I started three years ago", "I started around 2020", date(2020, 1, 1), Precision.YEAR),
        (
            "We married 5 months ago",
            "We married around December 2022",
            date(2022, 12, 1),
            Precision.MONTH,
        ),
        ("I leave in 3 months", "I leave around August 2023", date(2023, 8, 1), Precision.MONTH),
        (
            "We hike this weekend",
            "We hike on the weekend of 13 May 2023",
            date(2023, 5, 13),
            Precision.WEEKEND,
        ),
        (
            "We hiked last weekend",
            "We hiked on the weekend of 6 May 2023",
            date(2023, 5, 6),
            Precision.WEEKEND,
        ),
        (
            "It was a busy week last week",
            "It was a busy week in the week of 1 May 2023",
            date(2023, 5, 1),
            Precision.WEEK,
        ),
        (
            "My exam is next week",
            "My exam is in the week of 15 May 2023",
            date(2023, 5, 15),
            Precision.WEEK,
        ),
        ("In June I will travel", "In June 2023 I will travel", date(2023, 6, 1), Precision.MONTH),
        ("We went there last May", "We went there in May 2022", date(2022, 5, 1), Precision.MONTH),
        ("I visit next March", "I visit in March 2024", date(2024, 3, 1), Precision.MONTH),
    ],
)
def test_expression_resolves_to_an_absolute_date(
    text: str, rewritten: str, start: date, precision: Precision
) -> None:
    out, found = resolve(text, SAID)
    assert out == rewritten
    assert [(r.start, r.precision) for r in found] == [(start, precision)]


@pytest.mark.parametrize(
    "text",
    [
        "I may go",  # the modal verb, not the month
        "We met in May 2022",  # already absolute
        "I like Sundays",
        "Next steps are unclear",
    ],
)
def test_text_without_a_relative_expression_is_unchanged(text: str) -> None:
    assert resolve(text, SAID) == (text, [])


def test_sunday_weekend_is_the_one_under_way() -> None:
    sunday = datetime(2023, 5, 14, 10, 0, tzinfo=UTC)
    _, [weekend] = resolve("this weekend", sunday)
    assert weekend.start == date(2023, 5, 13)


def test_two_expressions_in_one_text_are_both_resolved_in_order() -> None:
    out, found = resolve("I ran yesterday and I swim next week", SAID)
    assert out == "I ran on 7 May 2023 and I swim in the week of 15 May 2023"
    assert [r.expression for r in found] == ["yesterday", "next week"]
