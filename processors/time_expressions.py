"""Relative time expressions resolved against the time a statement was made.

"I went there yesterday", said on 8 May 2023, is rewritten "… on 7 May 2023", and the date is
returned so the fact can carry it as a structured field. Recognition is a table of English
patterns (the ones people use in chat: "last Saturday", "two weeks ago", "this weekend",
"next month", "in June"…); the calendar arithmetic is python-dateutil's `relativedelta`.

Pure and deterministic: the same text and the same reference time give the same result. The
reference is the UTC date of the observation, since events carry no time zone of the speaker.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from enum import StrEnum
from typing import Final

from dateutil.relativedelta import FR, MO, SA, SU, TH, TU, WE, relativedelta, weekday


class Precision(StrEnum):
    DAY = "day"
    WEEK = "week"
    WEEKEND = "weekend"
    MONTH = "month"
    YEAR = "year"


@dataclass(frozen=True)
class Resolved:
    """One expression found in a text: what it said, when it means, and how precisely."""

    expression: str
    start: date  # the first day of the period it names
    precision: Precision
    approximate: bool = False

    def phrase(self, *, after_preposition: bool) -> str:
        """How the absolute date reads in place of the expression."""
        d = self.start
        text = {
            Precision.DAY: f"{d.day} {d:%B} {d.year}",
            Precision.WEEK: f"the week of {d.day} {d:%B} {d.year}",
            Precision.WEEKEND: f"the weekend of {d.day} {d:%B} {d.year}",
            Precision.MONTH: f"{d:%B} {d.year}",
            Precision.YEAR: str(d.year),
        }[self.precision]
        if self.approximate:
            return f"around {text}"
        if after_preposition:
            return text
        on_or_in = (
            "in" if self.precision in (Precision.WEEK, Precision.MONTH, Precision.YEAR) else "on"
        )
        return f"{on_or_in} {text}"


_WEEKDAYS: Final = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_MONTHS: Final = (
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
)
_NUMBERS: Final = {
    "a": 1,
    "an": 1,
    "one": 1,
    "a couple of": 2,
    "a couple": 2,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "a few": 3,
    "few": 3,
}
_NUMBER = (
    r"(?P<n>\d{1,2}|" + "|".join(sorted(map(re.escape, _NUMBERS), key=len, reverse=True)) + ")"
)
_UNIT = r"(?P<unit>day|week|month|year)s?"
_WEEKDAY = r"(?P<wd>" + "|".join(_WEEKDAYS) + ")"
_MONTH = r"(?P<month>" + "|".join(_MONTHS) + ")"
# Words after which the date stands bare: "since last year" → "since 2022", not "since in 2022".
_PREPOSITIONS: Final = frozenset(
    ("on", "in", "at", "since", "until", "till", "by", "before", "after", "from", "of", "to")
)


def _day(d: date) -> Resolved:
    return Resolved("", d, Precision.DAY)


def _monday(d: date) -> date:
    return d - timedelta(days=d.weekday())


def _week(d: date) -> Resolved:
    return Resolved("", _monday(d), Precision.WEEK)


def _weekend(d: date) -> Resolved:
    return Resolved("", d, Precision.WEEKEND)


def _month(d: date) -> Resolved:
    return Resolved("", d.replace(day=1), Precision.MONTH)


def _year(d: date) -> Resolved:
    return Resolved("", d.replace(month=1, day=1), Precision.YEAR)


def _wd(name: str, n: int) -> weekday:
    day: weekday = (MO, TU, WE, TH, FR, SA, SU)[_WEEKDAYS.index(name.lower())](n)
    return day


def _saturday_on_or_after(d: date) -> date:
    saturday: date = d + relativedelta(weekday=_wd("saturday", +1))
    return saturday


def _this_weekend(d: date) -> date:
    # On a Sunday "this weekend" is the one under way, not the next.
    return d - timedelta(days=1) if d.weekday() == 6 else _saturday_on_or_after(d)


def _count(m: re.Match[str]) -> int:
    word = " ".join(m["n"].lower().split())
    return _NUMBERS[word] if word in _NUMBERS else int(word)


def _shifted(m: re.Match[str], d: date, sign: int) -> Resolved:
    """ "two weeks ago", "in 3 months": a day, a month or a year away, approximately."""
    n, unit = _count(m), m["unit"].lower()
    steps = {
        "day": relativedelta(days=n),
        "week": relativedelta(weeks=n),
        "month": relativedelta(months=n),
        "year": relativedelta(years=n),
    }[unit]
    moved = d + steps if sign > 0 else d - steps
    if unit == "month":
        return Resolved("", moved.replace(day=1), Precision.MONTH, approximate=True)
    if unit == "year":
        return Resolved("", moved.replace(month=1, day=1), Precision.YEAR, approximate=n > 1)
    return Resolved("", moved, Precision.DAY, approximate=unit == "week" or n > 2)


def _last_weekday(m: re.Match[str], d: date) -> Resolved:
    return _day(d + relativedelta(days=-1, weekday=_wd(m["wd"], -1)))


def _next_weekday(m: re.Match[str], d: date) -> Resolved:
    return _day(d + relativedelta(days=+1, weekday=_wd(m["wd"], +1)))


def _coming_weekday(m: re.Match[str], d: date) -> Resolved:
    return _day(d + relativedelta(weekday=_wd(m["wd"], +1)))


def _named_month(m: re.Match[str], d: date) -> Resolved:
    which = (m.groupdict().get("which") or "").lower()
    month = _MONTHS.index(m["month"].lower()) + 1
    year = d.year
    if which == "last":
        year = d.year if month < d.month else d.year - 1
    elif which == "next":
        year = d.year if month > d.month else d.year + 1
    return Resolved("", date(year, month, 1), Precision.MONTH)


Rule = Callable[[re.Match[str], date], Resolved]

# First match wins at a position, so longer expressions come before their prefixes
# ("the day before yesterday" before "yesterday", "last weekend" before "last week").
RULES: Final[tuple[tuple[str, Rule], ...]] = (
    (r"the day before yesterday", lambda m, d: _day(d - timedelta(days=2))),
    (r"the day after tomorrow", lambda m, d: _day(d + timedelta(days=2))),
    (r"yesterday", lambda m, d: _day(d - timedelta(days=1))),
    (r"last night", lambda m, d: _day(d - timedelta(days=1))),
    (r"today|tonight|this (?:morning|afternoon|evening)", lambda m, d: _day(d)),
    (r"tomorrow", lambda m, d: _day(d + timedelta(days=1))),
    (r"(?:last|this past) weekend", lambda m, d: _weekend(_this_weekend(d) - timedelta(days=7))),
    (r"this weekend|this coming weekend", lambda m, d: _weekend(_this_weekend(d))),
    (r"next weekend", lambda m, d: _weekend(_this_weekend(d) + timedelta(days=7))),
    (r"(?:last|this past) week", lambda m, d: _week(d - timedelta(days=7))),
    (r"this week", lambda m, d: _week(d)),
    (r"next week", lambda m, d: _week(d + timedelta(days=7))),
    (r"(?:last|this past) month", lambda m, d: _month(d - relativedelta(months=1))),
    (r"this month", lambda m, d: _month(d)),
    (r"next month", lambda m, d: _month(d + relativedelta(months=1))),
    (r"last year", lambda m, d: _year(d - relativedelta(years=1))),
    (r"this year", lambda m, d: _year(d)),
    (r"next year", lambda m, d: _year(d + relativedelta(years=1))),
    (rf"(?:last|this past) {_WEEKDAY}", _last_weekday),
    (rf"next {_WEEKDAY}", _next_weekday),
    (rf"this (?:coming )?{_WEEKDAY}", _coming_weekday),
    (rf"{_NUMBER} {_UNIT} ago", lambda m, d: _shifted(m, d, -1)),
    (rf"in {_NUMBER} {_UNIT}(?! ago)", lambda m, d: _shifted(m, d, +1)),
    (rf"(?P<which>last|next|this) {_MONTH}", _named_month),
    # A month named alone ("in June") is this year's; only "in" makes it a date, not "may".
    (rf"in {_MONTH}(?! \d)(?!,? \d{{4}})", _named_month),
)
_COMPILED: Final = tuple(
    (re.compile(rf"\b(?:{pattern})\b", re.IGNORECASE), rule) for pattern, rule in RULES
)
_WORD_BEFORE = re.compile(r"(\w+)\W*$")


def find(text: str, at: datetime | date) -> list[tuple[int, int, Resolved]]:
    """(start, end, resolution) of every expression, left to right, none overlapping."""
    # The UTC day, not the day in the event's own offset: a replay reads the event back from
    # Postgres in UTC, and "yesterday" must name the same day (and the fact keep its id).
    day = at.astimezone(UTC).date() if isinstance(at, datetime) else at
    found: list[tuple[int, int, Resolved]] = []
    taken: list[tuple[int, int]] = []
    for regex, rule in _COMPILED:
        for m in regex.finditer(text):
            if any(m.start() < end and start < m.end() for start, end in taken):
                continue
            resolved = rule(m, day)
            found.append((m.start(), m.end(), _with_text(resolved, m.group(0))))
            taken.append((m.start(), m.end()))
    return sorted(found, key=lambda f: f[0])


def _with_text(resolved: Resolved, expression: str) -> Resolved:
    return Resolved(expression, resolved.start, resolved.precision, resolved.approximate)


def resolve(text: str, at: datetime | date) -> tuple[str, list[Resolved]]:
    """The text with each relative expression replaced by its absolute date, and the dates.

    "in June" keeps its "in"; elsewhere a preposition before the expression ("since last
    year") is kept and the date follows it bare.
    """
    found = find(text, at)
    out, last = [], 0
    for start, end, resolved in found:
        before = _WORD_BEFORE.search(text[last:start])
        after_preposition = before is not None and before.group(1).lower() in _PREPOSITIONS
        phrase = resolved.phrase(after_preposition=after_preposition)
        if resolved.expression.lower().startswith("in ") and not resolved.approximate:
            phrase = phrase if phrase.startswith(("in ", "on ")) else f"in {phrase}"
        if resolved.expression[:1].isupper():
            phrase = phrase[0].upper() + phrase[1:]
        out += [text[last:start], phrase]
        last = end
    out.append(text[last:])
    return "".join(out), [r for _, _, r in found]
