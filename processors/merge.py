"""Merging a new statement into a fact that already says part of it.

A merged fact must read as one statement: what the new line repeats (in the same or in other
words: "CEO" and "chief executive", "startup" and "company") is not written twice; a richer
wording of the whole fact replaces it; otherwise only the new line's sentences that add details
are appended.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Final

from domain.model import Fact
from domain.timed_cache import timed_memo
from processors.gate import DUPLICATE_COSINE
from processors.heuristics import Similarity, as_sentence, content_words
from processors.plan import Draft, Plan, believed
from processors.schema import ConsolidationRequest
from processors.speakers import split_speaker
from processors.statements import sentences
from producers.contract import ContextEvent

# A fact merged from several lines stops growing here.
MAX_MERGED_CHARS = 280
# A speaker's next line goes on with their previous one at this similarity (cosine; the
# word-overlap measure without an embedder is scaled down, as for duplicates).
THREAD_COSINE = 0.45
# A stored fact of the same speaker observed this long before a line is still the same
# conversation, so the line may go on with it: a batch boundary does not end a thread.
THREAD_WINDOW = timedelta(hours=1)
# New details worth merging into a fact: at least this many content words it lacks.
MIN_NEW_WORDS = 2

# Wordings of one thing, folded before two statements' words are compared.
_SAME_THING: Final = tuple(
    (re.compile(pattern), replacement)
    for pattern, replacement in (
        (r"\bchief executive(?: officer)?\b", "ceo"),
        (r"\bchief (?:technology|technical) officer\b", "cto"),
        (r"\bchief operating officer\b", "coo"),
        (r"\bchief financial officer\b", "cfo"),
        (r"\b(?:start-?ups?|firms?|business(?:es)?)\b", "company"),
        (r"\b(?:is based|resides|is located|is living|stays)(?= in\b)", "lives"),
        (r"\b(?:is employed (?:at|by)|works for)\b", "works at"),
        (r"\b(?:kids|child|children)\b", "kid"),
        (r"\bpics?\b|\bpictures?\b|\bimages?\b", "photo"),
    )
)


@timed_memo(max_entries=65_536)
def folded_words(text: str) -> frozenset[str]:
    """The content words of `text` with synonymous wordings folded into one."""
    low = text.lower()
    for pattern, replacement in _SAME_THING:
        low = pattern.sub(replacement, low)
    return content_words(low)


def new_words(old: str, new: str) -> frozenset[str]:
    """What `new` says that `old` does not, as folded content words."""
    return folded_words(new) - folded_words(old)


def merge_details(old: str, new: str, limit: int = MAX_MERGED_CHARS) -> str | None:
    """`old` with what `new` adds to it: `old` itself when `new` adds nothing, None when the
    details do not fit in `limit` characters.

    A new wording that says everything `old` says and more replaces it; else the sentences of
    `new` that bring at least `MIN_NEW_WORDS` new words follow `old`, each once.
    """
    if len(new_words(old, new)) < MIN_NEW_WORDS:
        return old
    if not new_words(new, old):
        return new if len(new) <= limit else None
    speaker, said = split_speaker(new)
    if speaker is not None and speaker in old:
        new = said  # "Caroline: …" once is enough
    known = folded_words(old)
    added: list[str] = []
    for sentence in sentences(new):
        words = folded_words(sentence)
        if len(words - known) >= MIN_NEW_WORDS:
            added.append(sentence)
            known |= words
    if not added:
        return old
    merged = " ".join([as_sentence(old), *added])
    return merged if len(merged) <= limit else None


def thread_of(
    plan: Plan,
    request: ConsolidationRequest,
    event: ContextEvent,
    subject: str | None,
    text: str,
    sim: Similarity,
) -> Draft | Fact | None:
    """What a transcript line goes on with: the draft of its speaker's previous line in this
    session, else (the thread began in an earlier batch) the speaker's latest stored fact
    observed shortly before it; only on the same subject and with room for the line's details.
    The user's own observations were recorded one fact at a time: they have no thread."""
    if subject is None:
        return None
    floor = THREAD_COSINE * sim.duplicate / DUPLICATE_COSINE
    scope, session = event.source_metadata.connection_id, event.source_metadata.session_id
    for draft in plan.live(scope):
        if draft.session == session and draft.subject == subject:
            going_on = sim.score(draft.last_text, text) >= floor
            fits = merge_details(draft.proposal.content, text) is not None
            return draft if going_on and fits else None
    latest = next(
        (
            f
            for f in believed(request, plan)
            if f.provenance.connection_id == scope
            and f.subject == subject
            and f.observed_at is not None
            and timedelta(0) <= event.occurred_at - f.observed_at <= THREAD_WINDOW
        ),
        None,
    )
    if latest is None or merge_details(latest.content, text) is None:
        return None
    return latest if sim.score(latest.content, text) >= floor else None
