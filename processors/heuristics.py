"""Small deterministic text rules the offline backend uses instead of an LLM.

Everything here is table-driven and order-stable: the same text always gives the same slot,
the same rewrite and the same similarity, so an offline consolidation can be replayed
byte for byte.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from enum import StrEnum
from typing import Final, TypeVar

import numpy as np

from domain.ports import Embedder, Vector
from domain.timed_cache import timed_memo
from processors.speakers import INTERJECTED_NO, USER, about, split_speaker


class Slot(StrEnum):
    """A topic a statement is about; a correction replaces the latest fact of its slot."""

    NAME = "name"
    EMPLOYER = "employer"
    WORK = "work"
    LOCATION = "location"
    DIET = "diet"
    DRINK = "drink"
    SPOKEN_LANGUAGE = "spoken_language"
    TOOLS = "tools"
    SCHEDULE = "schedule"


_DEPARTMENTS = "design|engineering|marketing|sales|product|research|finance|operations|data|legal"
_ROLES = "engineer|designer|developer|manager|founder|ceo|cto|student|researcher|scientist|analyst"
_DRINKS = "coffee|tea|espresso|latte|flat whites?|matcha|alcohol|wine|beer"
_TOOLS = "python|rust|typescript|javascript|golang|kotlin|swift|editor|vim|vs ?code|figma|linear"

# First matching row wins, so the order settles ambiguities: "I work at Acme" is about the
# employer before it is about work, and "moved to design" is a role change, not a move.
SLOT_RULES: Final[tuple[tuple[Slot, str], ...]] = (
    (Slot.NAME, r"\bname(?:'s| is)\b|\bcall (?:me|the user)\b|\bgoes by\b"),
    (Slot.EMPLOYER, r"\bwork(?:s|ing|ed)? (?:at|for)\b|\bjoin(?:s|ed|ing)\b"),
    # "company" alone is any company ("the company of friends on a camping trip").
    (Slot.EMPLOYER, r"\b(?:employer|hired (?:by|at)|(?:my|the user's) (?:company|firm))\b"),
    (Slot.WORK, rf"\bmoved (?:over )?(?:in)?to (?:the )?(?:{_DEPARTMENTS})\b"),
    (Slot.WORK, r"\bwork(?:s|ing|ed)? (?:in|on|as)\b"),
    (Slot.WORK, r"\b(?:job|role|position|title|department|career|phd)\b"),
    # Being on a team, not waiting on one: "on the payments platform team".
    (Slot.WORK, r"\b(?:on|in|joined|leads?|manages?) (?:the |a )?(?:[\w'-]+ ){0,3}team\b"),
    # Not "co-founder": that is someone else's role.
    (Slot.WORK, rf"(?<!-)\b(?:{_ROLES})s?\b"),
    # Living somewhere, not "live honestly".
    (Slot.LOCATION, r"\b(?:live[sd]? in|living in|hometown|home town|time ?zone)\b"),
    (Slot.LOCATION, r"\bbased (?:in|out of)\b|\b(?:moved|moving|relocat\w*) to\b"),
    (Slot.DIET, r"\b(?:vegetarian|vegan|pescatarian|gluten|lactose|allerg\w*|diet|meat|eats?)\b"),
    (Slot.DRINK, rf"\b(?:{_DRINKS})\b"),
    (Slot.SPOKEN_LANGUAGE, r"\b(?:speaks?|native|fluent)\b"),
    (Slot.TOOLS, rf"\b(?:{_TOOLS})\b"),
    (Slot.SCHEDULE, r"\b(?:mornings?|afternoons?|evenings?|meetings?|working hours|schedule)\b"),
)
_COMPILED: Final = tuple((slot, re.compile(rule, re.IGNORECASE)) for slot, rule in SLOT_RULES)

# The slots that have their own scaffold key, holding the latest statement.
SCAFFOLD_SLOT_KEYS: Final[dict[Slot, str]] = {
    Slot.NAME: "Name",
    Slot.WORK: "Role",
    Slot.EMPLOYER: "Employer",
    Slot.LOCATION: "Location",
}


# "The user's sister's name is Ana", "Caroline's mom's job": an attribute of someone the
# statement names through a possessive, not of the user; it has the words of a slot, not its
# topic.
_SOMEONE_ELSES = re.compile(
    r"^\s*(?:[Tt]he user|[A-Z][\w-]*)['’]s\s+(?P<who>(?:[\w-]+\s+){0,2}?[\w-]+)['’]s\b"
)


def someone_else(text: str) -> str | None:
    """Whose attribute a statement is about when it is not its subject's own: "sister" for
    "The user's sister's name is Ana"; None for "The user's name is Maya"."""
    match = _SOMEONE_ELSES.match(text)
    return " ".join(match.group("who").casefold().split()) if match else None


def classify_slot(text: str) -> Slot | None:
    if someone_else(text) is not None:
        return None
    return next((slot for slot, rule in _COMPILED if rule.search(text)), None)


_OPEN_LOOP = re.compile(
    r"\b(?:deadline|due|todo|to-do|needs? to|have to|has to|must|follow[ -]up|remind\w*|"
    r"pending|blocked|by (?:mon|tue|wed|thu|fri|sat|sun|jan|feb|mar|apr|may|jun|jul|aug|sep|"
    r"oct|nov|dec|next|end|tomorrow|eod|\d))",
    re.IGNORECASE,
)


def is_open_loop(text: str) -> bool:
    """Does a project statement talk about something still to be done?"""
    return _OPEN_LOOP.search(text) is not None


# --- third person -----------------------------------------------------------------------


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# How people open a correction; none of it belongs in the corrected statement.
_PREAMBLE = re.compile(
    r"^(?:(?:(?:actually|correction|update|sorry|oops|wait|to clarify|scratch that|"
    rf"small correction|just to correct)\b|{INTERJECTED_NO})[\s,:;.!—–-]*)+",
    re.IGNORECASE,
)


def to_third_person(text: str) -> str:
    """Rewrite a first-person statement ("I work…") as one about its subject ("The user
    works…"), or about its speaker when a transcript line names one ("Caroline: I went" →
    "Caroline went")."""
    speaker, said = split_speaker(text.strip())
    out = said
    stripped = _PREAMBLE.sub("", out)
    if stripped and stripped != out:
        out = stripped[0].upper() + stripped[1:]
    rewritten = about(out, speaker or USER)
    # A line with no "I" in it still says whose it is.
    return rewritten if speaker is None or speaker in rewritten else f"{speaker}: {rewritten}"


# --- text shape -------------------------------------------------------------------------

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def clip(text: str, max_chars: int) -> str:
    """Shorten at a word boundary, marking the cut, so a capped text stays readable."""
    if len(text) <= max_chars:
        return text
    cut = text[: max_chars - 1]
    if " " in cut:
        cut = cut.rsplit(" ", 1)[0]
    return cut.rstrip() + "…"


def first_sentences(text: str, max_chars: int) -> str:
    """As many leading whole sentences as fit in `max_chars`, else a clipped first one."""
    flat = " ".join(text.split())
    out = ""
    for sentence in _SENTENCE_END.split(flat):
        candidate = f"{out} {sentence}".strip()
        if len(candidate) > max_chars:
            break
        out = candidate
    return out or clip(flat, max_chars)


def as_sentence(text: str) -> str:
    text = text.strip()
    return text if not text or text[-1] in ".!?…" else text + "."


def word_count(text: str) -> int:
    return len(text.split())


def approx_tokens(text: str) -> int:
    """Words × 1.3, rounded half up in integers so it is identical on every platform."""
    return (word_count(text) * 13 + 5) // 10


def is_fact_like(text: str) -> bool:
    """Mostly prose with a few content words: not a table dump, a hash or a blob of code."""
    visible = [c for c in text if not c.isspace()]
    letters = sum(c.isalpha() for c in visible)
    return bool(visible) and letters / len(visible) >= 0.6 and len(content_words(text)) >= 3


# --- similarity -------------------------------------------------------------------------

_STOPWORDS = _words(
    "a an the user user's users is are was were be been being am i me my mine to of in on at "
    "for and or with as by it its that this these those from so but also really just very "
    "has have had do does did s they them their there here about into over than then"
)
_WORD = re.compile(r"[a-z0-9]+(?:['’][a-z]+)?")


def _stem(word: str) -> str:
    if word.endswith(("n't", "n’t")):
        return "not"
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 4 and word.endswith(("shes", "ches", "xes", "oes")):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


# Each stored fact is compared with every batch: its words are remembered for a while.
@timed_memo(max_entries=65_536)
def content_words(text: str) -> frozenset[str]:
    words = (_stem(w) for w in _WORD.findall(text.lower()) if w not in _STOPWORDS)
    return frozenset(w for w in words if w not in _STOPWORDS)


T = TypeVar("T")

# How many stored facts a new statement is compared with: the cost of a batch must not grow
# with the user's memory.
MAX_CANDIDATES: Final = 32


def candidates(
    text: str, items: Sequence[T], content: Callable[[T], str], limit: int = MAX_CANDIDATES
) -> list[T]:
    """The `limit` items sharing the most content words with `text`, in their given order
    (newest first stays newest first). A near-duplicate shares words with what it repeats, so
    an item sharing none is never a candidate."""
    words = content_words(text)
    if not words:
        return []
    shared = [(len(words & content_words(content(item))), i) for i, item in enumerate(items)]
    best = sorted((pair for pair in shared if pair[0] > 0), key=lambda p: (-p[0], p[1]))[:limit]
    return [items[i] for i in sorted(i for _, i in best)]


def jaccard(a: str, b: str) -> float:
    wa, wb = content_words(a), content_words(b)
    if not wa or not wb:
        return 0.0
    return len(wa & wb) / len(wa | wb)


class Similarity:
    """Cosine over an `Embedder` when there is one, else Jaccard on content words.

    The thresholds differ because the two scales differ: paraphrases reach 0.85 cosine long
    before they share 80% of their words.
    """

    def __init__(self, embedder: Embedder | None, texts: Iterable[str] = ()) -> None:
        self._embedder = embedder
        self._vectors: dict[str, Vector] = {}
        self._words: dict[str, frozenset[str]] = {}
        self.duplicate = 0.85 if embedder is not None else 0.8
        self.related = 0.35 if embedder is not None else 0.2
        self._embed(texts)

    def _embed(self, texts: Iterable[str]) -> None:
        missing = sorted({t for t in texts if t not in self._vectors})
        if self._embedder is not None and missing:
            vectors = self._embedder.embed(missing)
            self._vectors.update(zip(missing, vectors, strict=True))

    def score(self, a: str, b: str) -> float:
        if self._embedder is None:
            # Every statement is compared with every other of its batch: tokenize each once.
            wa, wb = self._content_words(a), self._content_words(b)
            return len(wa & wb) / len(wa | wb) if wa and wb else 0.0
        self._embed((a, b))
        return float(np.dot(self._vectors[a], self._vectors[b]))

    def scores(self, text: str, others: Sequence[str]) -> list[float]:
        """`score(text, o)` for every o, as one matrix product when there are vectors."""
        if self._embedder is None or not others:
            return [self.score(text, o) for o in others]
        self._embed((text, *others))
        matrix = np.stack([self._vectors[o] for o in others])
        return [float(x) for x in matrix @ self._vectors[text]]

    def _content_words(self, text: str) -> frozenset[str]:
        if text not in self._words:
            self._words[text] = content_words(text)
        return self._words[text]
