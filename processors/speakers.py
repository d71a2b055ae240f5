"""Who a statement is about, and the statement rewritten about them.

A chat observation is the user's own word: "I moved to Porto" is about the user. A transcript
line names its speaker ("Caroline: I went to a support group"), and then the first person is
the speaker, not the user. The rewrite replaces the first person by the subject and makes the
verb agree ("I go" → "Caroline goes", "I'm" → "Caroline is") without touching what is not a
verb ("I totally agree" → "Caroline totally agrees", "me-time" stays "me-time").
"""

from __future__ import annotations

import re
from typing import Final

USER: Final = "the user"
# "No" as an interjection that opens a reply or a correction ("No, I live in Berlin", "Nope.")
# has punctuation after it; "No more coffee", "No longer vegetarian", "No-one" are content.
INTERJECTED_NO: Final = r"\b(?:no|nope)(?=\s*(?:[,!.…:;—–]|-(?![\w-])|$))"


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# "Name: text" or "First Last: text". Labels people put before a colon are not speakers.
_SPEAKER = re.compile(r"^(?P<name>[A-Z][\w'’.-]{0,30}(?: [A-Z][\w'’.-]{0,30}){0,2}):\s+(?=\S)")
_LABELS: Final = _words(
    "note notes update correction reminder todo to-do re fwd fw subject summary ps fyi "
    "attachment edit warning error question answer tip important status deadline goal "
    "idea plan action agenda context background decision next result results date time "
    "location meeting call email task tasks project projects preference preferences fact "
    "facts source link file observation observations q a"
)


def split_speaker(content: str) -> tuple[str | None, str]:
    """(speaker, what they said); (None, content) when the text names no speaker."""
    match = _SPEAKER.match(content)
    if match is None or match.group("name").casefold() in _LABELS:
        return None, content
    return match.group("name"), content[match.end() :]


_ADVERBS: Final = _words(
    "really also usually always never often just still mostly generally now currently recently "
    "sometimes only rarely definitely mainly actually already typically even ever once first "
    "finally kinda sorta truly totally absolutely honestly literally basically seriously "
    "certainly probably possibly simply especially personally"
)
# Adverbs of more than one word, and "not": "I no longer live", "I kind of like".
_PHRASE_ADVERBS: Final = ("no longer", "kind of", "sort of", "not")
# Words ending in -ly that are verbs, not adverbs.
_LY_VERBS: Final = _words(
    "apply reply rely supply fly multiply comply imply ally rally tally bully"
)
# Modals, past forms, and words that follow "I" without being a present-tense verb.
_KEEP: Final = _words(
    "can cannot could will would should must might may shall was had did won went got made took "
    "left "
    "said came became began bought built felt found gave grew heard held kept knew led lost met "
    "paid ran saw sent set sold spent stood taught thought told understood wrote quit read put "
    "cut hit let shut hurt cost fell drew drove ate flew forgot swam sang wore chose broke woke "
    "rode spoke stole threw "
    "and or but too so then gotta gonna wanna guess"
)
_IRREGULAR: Final = {"am": "is", "are": "is", "have": "has", "do": "does", "go": "goes", "be": "is"}


def _is_adverb(word: str) -> bool:
    low = word.lower()
    if low in _ADVERBS or low in _PHRASE_ADVERBS:
        return True
    return low.endswith("ly") and low not in _LY_VERBS and len(low) > 3


def third_person_verb(verb: str) -> str:
    """The form a verb takes after "she": "agree" → "agrees", "try" → "tries"."""
    low = verb.lower()
    # "-ed" is past tense ("moved"), but "-eed" is usually not ("need", "proceed").
    if low in _KEEP or (low.endswith("ed") and not low.endswith("eed")):
        return verb
    if low in _IRREGULAR:
        return _IRREGULAR[low]
    if low.endswith(("s", "sh", "ch", "x", "z", "o")):
        return verb + "es"
    if len(low) > 1 and low.endswith("y") and low[-2] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


_APOSTROPHE = "['’]"
_CONTRACTIONS: Final = tuple(
    (re.compile(pattern), replacement)
    for pattern, replacement in (
        (rf"\bI(?:{_APOSTROPHE}m| am)\b", "{s} is"),
        (rf"\bI(?:{_APOSTROPHE}ve| have) been\b", "{s} has been"),
        (rf"\bI{_APOSTROPHE}ve\b", "{s} has"),
        (rf"\bI{_APOSTROPHE}d\b", "{s} would"),
        (rf"\bI{_APOSTROPHE}ll\b", "{s} will"),
        (rf"\bI (?:don{_APOSTROPHE}t|dont)\b", "{s} doesn't"),
        (r"\bI do not\b", "{s} does not"),
        (rf"\bI haven{_APOSTROPHE}t\b", "{s} hasn't"),
        (r"\bI have not\b", "{s} has not"),
        (rf"\bI (?:ain{_APOSTROPHE}t|aren{_APOSTROPHE}t)\b", "{s} isn't"),
    )
)
# "i" is the pronoun unless it is part of an abbreviation such as "i.e.".
_PRONOUN = r"\b[Ii]\b(?![.’'-]\w)"
_PHRASES = "|".join(p.replace(" ", r"\s+") for p in _PHRASE_ADVERBS)
_ADVERB = rf"(?:{_PHRASES}|[A-Za-z]+ly|{'|'.join(sorted(_ADVERBS))})"
_ADVERB_RUN = rf"(?:\s+{_ADVERB}\b)*"
_ADVERB_WORD = re.compile(rf"\b{_ADVERB}\b")
_SUBJECT_VERB = re.compile(rf"{_PRONOUN}({_ADVERB_RUN})\s+([A-Za-z]+)\b")
# "She and I", "My wife and I" at the start of a sentence: a plural subject, whose verb stays.
_PLURAL_HEAD = re.compile(
    r"(?:^|[.!?;:]\s+)(?:(?:my|our|his|her|their|the|a)\s+)?[\w'’]+\s+and\s+$", re.IGNORECASE
)
_REFLEXIVE = re.compile(r"\bmyself\b", re.IGNORECASE)
_POSSESSIVE = re.compile(r"\b(?:my|mine)\b(?![-’'])", re.IGNORECASE)
# Not "me-time" or "Me:" labels: only the pronoun standing alone.
_OBJECT = re.compile(r"\bme\b(?![-’'])", re.IGNORECASE)
_BARE_I = re.compile(_PRONOUN)


def _verb_after_i(match: re.Match[str], subject: str) -> str:
    # "no longer" is one adverb: split, "no" would be taken for the verb ("noes").
    words = [*(" ".join(a.split()) for a in _ADVERB_WORD.findall(match.group(1))), match.group(2)]
    if _PLURAL_HEAD.search(match.string[: match.start()]):
        return " ".join([subject, *words])
    # The verb is the first word that is not an adverb: "I apply" has no adverb at all.
    at = next((i for i, w in enumerate(words[:-1]) if not _is_adverb(w)), len(words) - 1)
    words[at] = third_person_verb(words[at])
    return " ".join([subject, *words])


# Verbs that follow "and" in "I live in Utrecht and commute to Amsterdam": the second verb
# shares the subject and must agree too. A closed list, and only before a word that starts a
# verb's complement, so "I like tea and cake" or "music and dance" are left alone.
_COORDINATED_VERBS: Final = _words(
    "commute work live love like enjoy prefer want need plan try go run walk play teach study "
    "write cook bake paint travel drive ride swim hike dance sing volunteer help spend take "
    "make keep use lead manage own build visit practice practise attend hope spend miss speak "
    "watch listen collect follow support coach mentor design develop code hate get bring"
)
_COMPLEMENT_STARTS = (
    "to at in on for with from by into the a an my his her their our it them him every each "
    "some all as about around out up back home there here daily weekly more less"
)
_COORDINATED = re.compile(
    rf"\b(and|but|or)({_ADVERB_RUN})\s+({'|'.join(sorted(_COORDINATED_VERBS))})"
    # or before a name: "prefer Postgres", "visit Lisbon".
    rf"(?=\s+(?:(?:{'|'.join(_COMPLEMENT_STARTS.split())})\b|[A-Z]))"
)
_CLAUSE_END = re.compile(r"(?<=[.!?;])\s+")


def _coordinated(text: str, subject: str) -> str:
    """Make the verbs after "and" agree in the sentences where `subject` replaced "I"."""
    out = []
    for sentence in _CLAUSE_END.split(text):
        at = sentence.casefold().find(subject.casefold() + " ")
        if at < 0 or sentence[:at].endswith(("and ", "or ")):
            # "My wife and I walk home": a plural subject, whose verbs stay as they are.
            out.append(sentence)
            continue
        tail = _COORDINATED.sub(
            lambda m: f"{m.group(1)}{m.group(2)} {third_person_verb(m.group(3))}", sentence[at:]
        )
        out.append(sentence[:at] + tail)
    return " ".join(out)


def _possessives(text: str, subject: str) -> str:
    """ "my" becomes the subject's; for the user, "their" once the sentence has named them:
    "The user likes their mornings free", not "the user likes the user's mornings free".
    A name stays a name ("Caroline loves Caroline's dog"): "their" could be anyone's."""
    if subject != USER:
        return _POSSESSIVE.sub(f"{subject}'s", text)
    out = []
    for sentence in _CLAUSE_END.split(text):
        named = sentence.casefold().find(subject.casefold())

        def own(m: re.Match[str], named: int = named) -> str:
            return "their" if 0 <= named < m.start() else f"{subject}'s"

        out.append(_POSSESSIVE.sub(own, sentence))
    return " ".join(out)


def about(text: str, subject: str = USER) -> str:
    """Rewrite the first person as `subject`: "I love my dog" → "Caroline loves Caroline's dog"."""
    out = text.strip()
    for regex, replacement in _CONTRACTIONS:
        out = regex.sub(replacement.replace("{s}", subject), out)
    out = _SUBJECT_VERB.sub(lambda m: _verb_after_i(m, subject), out)
    if out != text.strip():
        out = _coordinated(out, subject)
    out = _REFLEXIVE.sub("themselves", out)
    out = _possessives(out, subject)
    out = _OBJECT.sub(subject, out)
    out = _BARE_I.sub(subject, out)
    # "My name is Maya. I love dogs": the second sentence starts with the subject too.
    out = re.sub(rf"(?<=[.!?] ){re.escape(subject)}\b", capitalized(subject), out)
    return capitalized(out)


def capitalized(text: str) -> str:
    return text[:1].upper() + text[1:] if text[:1].islower() else text
