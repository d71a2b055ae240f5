"""From one observation to one compact statement: what it says, about whom, and when.

Extractive, with no model: the text is split into sentences; sentences that carry no
information (greetings, thanks, agreement, praise, questions) are dropped; fillers and
vocatives are cut from the rest; the first person becomes the subject; relative dates become
absolute ones. What is left is scored for the signals a reader would look for (names, numbers,
dates, preferences, plans, corrections), and that score is the fact's salience.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Final

from processors.speakers import INTERJECTED_NO, USER, about, capitalized, split_speaker
from processors.time_expressions import Resolved, resolve

MAX_STATEMENT_CHARS = 240
MAX_SENTENCES = 3
# A remark with no one in it ("Taking care of ourselves is vital") needs this many content words.
MIN_REMARK_WORDS = 4


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# --- information ------------------------------------------------------------------------

_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+(?=[\"'“(]?[A-Z0-9])|\s+[-–—]\s+(?=[A-Z])")
_CAPTION = re.compile(
    r"\s*\[shares? (?:a |an )?(?P<kind>photo|picture|image|video)[^:\]]*:\s*(?P<what>[^\]]*)\]"
)
_CAPTION_FILLER = re.compile(
    r"^(?:a |an )?(?:photo|picture|image|photography|close up|closeup)s? of ", re.IGNORECASE
)
# Openers that carry no content: interjections, backchannel, agreement.
_OPENER = re.compile(
    r"^(?:(?:(?:oh+|wow+|whoa|yeah+|yes+|yep|yup|hey+|hi+|hello|heya|well|so|haha+|hah|lol|omg|"
    r"aw+|ah+|um+|uh+|hmm+|btw|by the way|anyway|anyways|honestly|ok|okay|sure|totally|"
    r"absolutely|definitely|right|true|great|cool|awesome|nice|wait|man|dude|gosh|"
    r"geez|damn|ugh|phew|guess what|you know what|to be honest|thank you|thanks+|thx)\b|"
    rf"{INTERJECTED_NO})[\s,!.…:;-]*)+",
    re.IGNORECASE,
)
# Whole sentences that are social moves, not statements about anyone's world.
_PHATIC = re.compile(
    r"^(?:good (?:morning|afternoon|evening|night|luck|job|work|idea|point|call|to see you|"
    r"to hear(?: from you)?|for you)|"
    r"(?:it'?s |it is |so )?(?:good|great|nice|lovely) (?:to (?:see|hear|chat|talk|catch up)|"
    r"seeing|hearing|chatting|talking)|long time no (?:see|talk|chat)|how (?:are|have) you|"
    r"see you|talk (?:to you )?(?:soon|later)|catch you later|take care|bye|cheers|congrat|"
    r"thank|thanks|appreciate|(?:i'?m |i am )?(?:so |really )?(?:glad|happy|proud|excited) "
    r"(?:for|of) you|keep (?:it up|up the|going|on)|you(?:'re| are) (?:doing )?(?:so |such )?"
    r"(?:great|amazing|awesome|welcome|the best|a star|right|so right|an inspiration)|"
    r"you (?:got|have got) this|we got this|(?:that|this|it) (?:sounds|looks|seems|is|was|'s)"
    r" (?:so |really |super |totally |pretty )?(?:great|awesome|amazing|cool|fun|lovely|nice|"
    r"wonderful|fantastic|incredible|beautiful|exciting|interesting|impressive|inspiring|"
    r"sweet|adorable|cute|tough|hard|rough|scary|sad)|"
    r"(?:your|those) (?:kind )?words|that means (?:a lot|so much)|means a lot|"
    r"(?:i )?(?:totally |completely )?(?:agree|know what you mean|feel you|hear you)|me too|"
    r"same here|no worries|no problem|you'?re welcome|sounds (?:like )?(?:a plan|good|fun)|"
    r"let'?s (?:do it|keep|catch up)|enjoy|have (?:a |so much )?(?:fun|great|good)|"
    r"(?:i )?(?:can'?t|cannot) wait to (?:hear|see)|tell me (?:more|about)|what about you)",
    re.IGNORECASE,
)
# Words that evaluate or intensify without saying anything checkable.
_EMPTY_WORDS: Final = _words(
    "a an the and or but if of to in on at for with by from is are was were be been being am "
    "it its it's that that's this these those there here then than so too very really just "
    "such what how you you're your yours we we're our us they their them he she his her i "
    "me my mine i'm i've i'd i'll do does did doing done have has had having can could will "
    "would should may might must all some any more most much many lot lots one thing things "
    "stuff way ways great good nice cool awesome amazing wonderful fantastic incredible "
    "beautiful lovely sweet cute fun exciting excited happy glad proud sure yes yeah wow oh "
    "totally absolutely definitely super pretty truly always never ever also even still know "
    "think feel felt get got make made see seen look looks looking like love hope wish want "
    "say said tell told thanks thank appreciate keep going gonna wanna up out about again "
    "well right true hard tough important special awesome! kind means mean meant as not no "
    "don't doesn't didn't can't won't isn't wasn't sounds sound seems seem today agree agrees "
    "agreed"
)
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'’-]*")
_FILLERS = re.compile(
    r"\b(?:really|totally|truly|literally|basically|actually|honestly|kinda|sorta|"
    # "so" and "super" only as intensifiers, before what looks like an adjective.
    r"super(?= \w+(?:ing|ed|ful|ive|ous|y)\b)|"
    r"so(?= (?:much|many|\w+(?:ing|ed|ful|ive|ous|ble|y|ic|al|ant|ent)\b)))\s+",
    re.IGNORECASE,
)
_EMOJI = re.compile("[\U0001f300-\U0001faff\u2600-\u27bf\ufe0f]+")
_REPEATED_PUNCTUATION = re.compile(r"([!?.])[!?.]+")
_SPACES = re.compile(r"\s+")
_SPACE_BEFORE_PUNCTUATION = re.compile(r"\s+([,.;:!?])")

# Signals (salience): what makes a statement worth remembering.
# The speaker's own life: "I", "we" (the speaker among others), and sentences that leave the
# subject out because it is the speaker ("Been reading a lot", "Researching agencies").
_FIRST_PERSON = re.compile(
    r"\b(?:I|I'm|I've|I'd|I'll|my|me|mine|myself|we|we're|we've|our|ours|us)\b|"
    r"^(?:just |still |also |finally )?(?:been|gonna|got|had|went|made|started|finished|"
    r"\w+ing)\b",
    re.IGNORECASE,
)
_NUMBER = re.compile(
    r"\b\d[\d,.:]*\b|\b(?:one|two|three|four|five|six|seven|eight|nine|ten|"
    r"twenty|thirty|hundred|thousand|million)\b",
    re.IGNORECASE,
)
_PREFERENCE = re.compile(
    r"\b(?:love[sd]?|like[sd]?|prefer(?:s|red)?|favou?rite|enjoy(?:s|ed)?|hate[sd]?|"
    r"can'?t stand|allergic|fan of|passionate|into)\b",
    re.IGNORECASE,
)
_COMMITMENT = re.compile(
    r"\b(?:will|going to|gonna|plan(?:s|ning|ned)? to|need(?:s)? to|have to|has to|must|"
    r"deadline|due|promise[sd]?|decided|scheduled|signed up|starting|start(?:s|ed)?)\b",
    re.IGNORECASE,
)
_CORRECTION = re.compile(
    r"\b(?:actually|no longer|not anymore|any ?more|instead|moved|switched|changed|now)\b",
    re.IGNORECASE,
)
_HEDGE = re.compile(
    r"\b(?:maybe|perhaps|probably|might|not sure|i think|i guess|possibly|thinking about|"
    r"considering|wondering)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Signals:
    personal: bool = False  # the speaker says something about themselves
    names: int = 0  # proper names other than the sentence's first word
    numbers: int = 0
    dates: int = 0
    preference: bool = False
    commitment: bool = False
    correction: bool = False
    hedged: bool = False
    content_words: int = 0

    def salience(self) -> float:
        score = 0.35 + 0.04 * min(self.content_words, 6)
        score += 0.1 * self.personal + 0.06 * min(self.names, 2) + 0.05 * min(self.numbers, 2)
        score += 0.1 * min(self.dates, 1) + 0.08 * self.preference + 0.08 * self.commitment
        score += 0.05 * self.correction
        return round(min(score, 0.95), 2)

    def confidence(self, base: float) -> float:
        return round(base - 0.15 if self.hedged else base, 2)


@dataclass(frozen=True)
class Statement:
    text: str
    subject: str | None  # who it is about when a transcript named them; None is the user
    dates: tuple[Resolved, ...] = ()
    signals: Signals = field(default_factory=Signals)

    @property
    def event_date(self) -> date | None:
        return self.dates[0].start if self.dates else None


def content_words(sentence: str, names: Iterable[str] = ()) -> list[str]:
    skip = {n.casefold() for n in names}
    out = []
    for word in _WORD.findall(sentence):
        low = word.casefold().replace("’", "'")
        if low in _EMPTY_WORDS or low in skip or (len(low) < 3 and not low.isdigit()):
            continue
        out.append(low)
    return out


def is_question(sentence: str) -> bool:
    return sentence.rstrip(" \"'”)").endswith("?")


# A remark addressed to the listener ("You'd be a great counselor!") is a reaction, not news.
_ADDRESSED = re.compile(r"^(?:you|your|you'?re|you'?ve|you'?d|you'?ll|yours)\b", re.IGNORECASE)


def carries_information(
    sentence: str, names: Iterable[str] = (), remark_words: int | None = None
) -> bool:
    """False for a greeting, thanks, agreement, praise or question: nothing to remember."""
    body = _OPENER.sub("", sentence.strip()).strip(" ,!.…")
    if not body or is_question(sentence) or _PHATIC.match(body) or _ADDRESSED.match(body):
        return False
    # "I'm vegetarian" says something with one word; a remark with no one in it needs two.
    needed = 1 if _FIRST_PERSON.search(body) else remark_words or MIN_REMARK_WORDS
    return len(content_words(body, names)) >= needed


def informative(text: str) -> bool:
    """Does any sentence of a fact say something (a shared photo counts)?

    Laxer than extraction: a written fact may leave its subject out ("Prefers tea"), so two
    content words outside a greeting, thanks, agreement or question are enough."""
    speaker, said = split_speaker(" ".join(text.split()))
    if _CAPTION.search(said):
        return True
    names = [speaker] if speaker else []
    return any(carries_information(s, names, remark_words=2) for s in sentences(said))


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text) if s and s.strip()]


def _vocatives(names: Iterable[str]) -> re.Pattern[str] | None:
    """ ", Mel!" or "Caroline, " addressed to someone: the other speaker's name or a short form."""
    forms = sorted({n for name in names for n in _short_forms(name)}, key=len, reverse=True)
    if not forms:
        return None
    alternatives = "|".join(re.escape(f) for f in forms)
    return re.compile(rf",\s*(?:{alternatives})(?=\s*[!.?,]|$)|^(?:{alternatives})\s*[,!]\s*")


def _short_forms(name: str) -> set[str]:
    first = name.split(maxsplit=1)[0]
    return {name, first, *(first[:n] for n in range(3, len(first)))}


def compact(sentence: str, vocatives: re.Pattern[str] | None) -> str:
    text = _EMOJI.sub("", sentence)
    text = _OPENER.sub("", text.strip())
    if vocatives is not None:
        text = vocatives.sub("", text)
        text = _OPENER.sub("", text.strip())
    text = _FILLERS.sub("", text)
    text = _REPEATED_PUNCTUATION.sub(r"\1", text)
    text = _SPACE_BEFORE_PUNCTUATION.sub(r"\1", _SPACES.sub(" ", text)).strip(" ,;:-–—")
    return capitalized(text)


def _signals(raw: str, names: Iterable[str], dates: int) -> Signals:
    words = _WORD.findall(raw)
    skip = {n.casefold() for n in names}
    proper = [
        w
        for i, w in enumerate(words)
        if i > 0
        and w[:1].isupper()
        and w.casefold() not in skip
        and w not in ("I", "I'm", "I've", "I'd", "I'll")
    ]
    return Signals(
        personal=_FIRST_PERSON.search(raw) is not None,
        names=len(proper),
        numbers=len(_NUMBER.findall(raw)),
        dates=dates,
        preference=_PREFERENCE.search(raw) is not None,
        commitment=_COMMITMENT.search(raw) is not None,
        correction=_CORRECTION.search(raw) is not None,
        hedged=_HEDGE.search(raw) is not None,
        content_words=len(content_words(raw, names)),
    )


def _caption(match: re.Match[str] | None) -> str | None:
    if match is None:
        return None
    what = _CAPTION_FILLER.sub("", match.group("what").strip()).rstrip(". ")
    return f"shared a {match.group('kind')} of {what}" if what else None


@dataclass(frozen=True)
class _Scored:
    position: int
    text: str
    signals: Signals
    dates: tuple[Resolved, ...] = ()


def extract(content: str, at: datetime, others: Iterable[str] = ()) -> Statement | None:
    """The compact statement an observation makes, or None when it makes none.

    `others` are names the text may address (the other speakers of a transcript): a vocative
    "Thanks, Mel!" is not information about Mel.
    """
    speaker, text = split_speaker(" ".join(content.split()))
    caption = _caption(_CAPTION.search(text))
    text = _CAPTION.sub("", text)
    names = [n for n in (speaker, *others) if n]
    vocatives = _vocatives(names)
    subject = speaker or USER
    kept: list[_Scored] = []
    for position, sentence in enumerate(sentences(text)):
        if not carries_information(sentence, names):
            continue
        resolved_text, dates = resolve(compact(sentence, vocatives), at)
        signals = _signals(sentence, names, len(dates))
        kept.append(_Scored(position, about(resolved_text, subject), signals, tuple(dates)))
    if caption is not None:
        kept.append(_Scored(len(kept) + 100, f"{capitalized(subject)} {caption}.", Signals()))
    chosen = _fit(kept)
    if not chosen:
        return None
    joined = " ".join(_closed(s.text) for s in chosen[:-1]) + " " + chosen[-1].text
    joined = joined.strip()
    if speaker is not None and speaker not in joined:
        # "Researching adoption agencies": whose research, the fact itself must say.
        joined = f"{speaker}: {joined}"
    found = tuple(d for s in chosen for d in s.dates)
    return Statement(joined, speaker, found, _merged(s.signals for s in chosen))


def _closed(sentence: str) -> str:
    """A sentence followed by another ends with its punctuation, even if it was a dash."""
    return sentence if sentence[-1:] in ".!?…" else sentence + "."


def _fit(kept: list[_Scored]) -> list[_Scored]:
    """The most informative sentences that fit, in their original order."""
    ranked = sorted(kept, key=lambda s: (-s.signals.salience(), s.position))
    chosen: list[_Scored] = []
    size = 0
    for s in ranked[:MAX_SENTENCES]:
        if chosen and size + len(s.text) + 1 > MAX_STATEMENT_CHARS:
            continue
        chosen.append(s)
        size += len(s.text) + 1
    return sorted(chosen, key=lambda s: s.position)


def _merged(signals: Iterable[Signals]) -> Signals:
    items = list(signals)
    return Signals(
        personal=any(s.personal for s in items),
        names=sum(s.names for s in items),
        numbers=sum(s.numbers for s in items),
        dates=sum(s.dates for s in items),
        preference=any(s.preference for s in items),
        commitment=any(s.commitment for s in items),
        correction=any(s.correction for s in items),
        hedged=all(s.hedged for s in items),
        content_words=sum(s.content_words for s in items),
    )
