"""Relative time expressions resolved against the time they were said, table-driven."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone

import pytest

from processors.time_expressions import Precision, resolve

# Monday 8 May 2023, 13:56 UTC: a LoCoMo session's time.
SAID = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
DAY, WEEK, WEEKEND = Precision.DAY, Precision.WEEK, Precision.WEEKEND
MONTH, YEAR = Precision.MONTH, Precision.YEAR

# (text, rewritten, start of the period meant, its precision)
RESOLVED = [
    ("I joined a group yesterday", "I joined a group on 7 May 2023", "2023-05-07", DAY),
    ("We watched it last night", "We watched it on 7 May 2023", "2023-05-07", DAY),
    ("I got it the day before yesterday", "I got it on 6 May 2023", "2023-05-06", DAY),
    ("I start today", "I start on 8 May 2023", "2023-05-08", DAY),
    ("The show is tonight", "The show is on 8 May 2023", "2023-05-08", DAY),
    ("I fly out tomorrow", "I fly out on 9 May 2023", "2023-05-09", DAY),
    ("I ran a race last Saturday", "I ran a race on 6 May 2023", "2023-05-06", DAY),
    ("We met this past Friday", "We met on 5 May 2023", "2023-05-05", DAY),
    ("The party is next Friday", "The party is on 12 May 2023", "2023-05-12", DAY),
    ("The recital is this Sunday", "The recital is on 14 May 2023", "2023-05-14", DAY),
    ("We are going camping next month", "We are going camping in June 2023", "2023-06-01", MONTH),
    ("I was sick last month", "I was sick in April 2023", "2023-04-01", MONTH),
    ("I am busy this month", "I am busy in May 2023", "2023-05-01", MONTH),
    ("I painted that last year", "I painted that in 2022", "2022-01-01", YEAR),
    ("I graduate next year", "I graduate in 2024", "2024-01-01", YEAR),
    ("Since last year I have run", "Since 2022 I have run", "2022-01-01", YEAR),
    ("I moved two weeks ago", "I moved around 24 April 2023", "2023-04-24", DAY),
    ("I called her a few days ago", "I called her around 5 May 2023", "2023-05-05", DAY),
    ("I started three years ago", "I started around 2020", "2020-01-01", YEAR),
    ("We married 5 months ago", "We married around December 2022", "2022-12-01", MONTH),
    ("I leave in 3 months", "I leave around August 2023", "2023-08-01", MONTH),
    ("We hike this weekend", "We hike on the weekend of 13 May 2023", "2023-05-13", WEEKEND),
    ("We hiked last weekend", "We hiked on the weekend of 6 May 2023", "2023-05-06", WEEKEND),
    ("I was busy last week", "I was busy in the week of 1 May 2023", "2023-05-01", WEEK),
    ("My exam is next week", "My exam is in the week of 15 May 2023", "2023-05-15", WEEK),
    ("In June I will travel", "In June 2023 I will travel", "2023-06-01", MONTH),
    ("We went there last May", "We went there in May 2022", "2022-05-01", MONTH),
    ("I visit next March", "I visit in March 2024", "2024-03-01", MONTH),
]


@pytest.mark.parametrize(("text", "rewritten", "start", "precision"), RESOLVED)
def test_expression_resolves_to_an_absolute_date(
    text: str, rewritten: str, start: str, precision: Precision
) -> None:
    out, found = resolve(text, SAID)
    assert out == rewritten
    assert [(r.start, r.precision) for r in found] == [(date.fromisoformat(start), precision)]


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


@pytest.mark.parametrize(
    "said",
    [
        # 1:00 on 8 May in Tokyo is 16:00 on 7 May in UTC: "yesterday" is 6 May either way.
        datetime(2023, 5, 8, 1, 0, tzinfo=timezone(timedelta(hours=9))),
        datetime(2023, 5, 7, 16, 0, tzinfo=UTC),
        # 20:00 on 7 May in New York is already 8 May in UTC.
        datetime(2023, 5, 7, 20, 0, tzinfo=timezone(timedelta(hours=-4))),
    ],
)
def test_the_reference_day_is_the_utc_one_whatever_offset_the_event_carries(
    said: datetime,
) -> None:
    # A replay reads the event back from Postgres in UTC: the same text must give the same date.
    expected_day = said.astimezone(UTC).date() - timedelta(days=1)
    _, [yesterday] = resolve("I went yesterday", said)
    assert yesterday.start == expected_day
    assert resolve("I went yesterday", said) == resolve("I went yesterday", said.astimezone(UTC))
