"""The write gate: a deterministic check between what the model proposes and what is stored.

It is separate from the extractor on purpose: a prompt change or a different model cannot
loosen it. Verdicts: allow (stored active), hold (stored, not retrieved until reinforced),
discard (not stored), or reinforce an existing fact instead of adding a near-duplicate.
Content without information (a greeting, thanks, agreement, a question that asserts nothing)
is discarded with its own reason, whichever backend proposed it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from domain.ids import normalize_content
from domain.model import Fact, FactType
from domain.ports import Embedder
from domain.timed_cache import timed_memo
from processors.heuristics import candidates
from processors.schema import FactProposal
from processors.statements import informative

MIN_CONTENT_CHARS = 8
MIN_CONFIDENCE = 0.4
HOLD_BELOW_CONFIDENCE = 0.6
MIN_SALIENCE = 0.2
MIN_EPHEMERAL_SALIENCE = 0.6
DUPLICATE_COSINE = 0.85
EPHEMERAL_TYPES = frozenset({FactType.EPISODIC})
NO_INFORMATION = "no information: greeting, thanks, agreement, praise or question"

_INSTRUCTION_ARTIFACTS = re.compile(
    r"ignore (all |any )?(previous|prior|above) instructions|system prompt|"
    r"</?observation|you are (now )?(an? )?(ai|assistant|language model)|"
    r"as an ai\b|^\s*(assistant|system)\s*:|```",
    re.IGNORECASE,
)

# Paraphrases that mean the same relation; folded before comparing two facts.
_SYNONYMS = (
    (
        re.compile(r"\b(is based in|resides in|is located in|lives in|is living in|stays in)\b"),
        "lives in",
    ),
    (re.compile(r"\b(works at|is employed at|is employed by|works for)\b"), "works at"),
    (re.compile(r"\b(prefers|likes|enjoys|loves)\b"), "likes"),
    (re.compile(r"\b(the user|user|they|she|he)\b"), ""),
)
_WORD = re.compile(r"[a-z0-9]+")


class Verdict(StrEnum):
    ALLOW = "allow"
    HOLD = "hold"
    DISCARD = "discard"
    REINFORCE = "reinforce"


@dataclass(frozen=True)
class GateDecision:
    verdict: Verdict
    reason: str
    duplicate_of: Fact | None = None


# Every proposal is compared with the stored facts: their forms are remembered for a while.
@timed_memo(max_entries=65_536)
def canonical_form(content: str) -> str:
    text = normalize_content(content)
    for pattern, replacement in _SYNONYMS:
        text = pattern.sub(replacement, text)
    return " ".join(_WORD.findall(text))


class WriteGate:
    """Judges proposals one at a time against the facts active at that moment of the run."""

    def __init__(
        self, embedder: Embedder | None, duplicate_cosine: float = DUPLICATE_COSINE
    ) -> None:
        # Active facts are compared on every run: give it a caching embedder (the composition
        # root does), so their vectors are computed once per process, not once per proposal.
        self._embedder = embedder
        self._duplicate_cosine = duplicate_cosine

    def prepare(self, proposals: Sequence[FactProposal], active: Sequence[Fact]) -> None:
        """Embed in one call what judging these proposals will compare, as far as it can be
        told beforehand: each proposal passing the cheap checks that shares words with an
        active fact or another proposal, and those it shares them with. The float graph costs
        less per text in a call of several (3.6 ms for one, 2.4 ms each in fours: BENCHMARKS,
        "Query batches"); the integer one runs a call's texts side by side on the cores it may
        use. The caching embedder keeps the vectors for `find_duplicate`.
        """
        if self._embedder is None:
            return
        contents = [p.content for p in proposals if self._refusal(p) is None]
        pool = [*(f.content for f in active), *contents]
        texts: list[str] = []
        for content in contents:
            near = candidates(content, [t for t in pool if t != content], lambda t: t)
            if near:
                texts += [content, *near]
        if len(texts) > 1:
            self._embedder.embed(list(dict.fromkeys(texts)))

    def judge(self, proposal: FactProposal, existing: Sequence[Fact]) -> GateDecision:
        refusal = self._refusal(proposal)
        if refusal is not None:
            return refusal
        duplicate = self.find_duplicate(proposal.content, existing)
        if duplicate is not None:
            return GateDecision(Verdict.REINFORCE, "near-duplicate of an active fact", duplicate)
        if proposal.confidence < HOLD_BELOW_CONFIDENCE:
            return GateDecision(
                Verdict.HOLD, f"confidence {proposal.confidence} < {HOLD_BELOW_CONFIDENCE}"
            )
        return GateDecision(Verdict.ALLOW, "passed")

    @staticmethod
    def _refusal(proposal: FactProposal) -> GateDecision | None:
        """The discard of a proposal that fails a check needing no other fact, or None."""
        content = proposal.content
        if len(content) < MIN_CONTENT_CHARS:
            return GateDecision(Verdict.DISCARD, f"content shorter than {MIN_CONTENT_CHARS} chars")
        if _INSTRUCTION_ARTIFACTS.search(content):
            return GateDecision(Verdict.DISCARD, "instruction artifact")
        if not informative(content):
            return GateDecision(Verdict.DISCARD, NO_INFORMATION)
        if proposal.confidence < MIN_CONFIDENCE:
            return GateDecision(
                Verdict.DISCARD, f"confidence {proposal.confidence} < {MIN_CONFIDENCE}"
            )
        floor = MIN_EPHEMERAL_SALIENCE if proposal.type in EPHEMERAL_TYPES else MIN_SALIENCE
        if proposal.salience < floor:
            return GateDecision(Verdict.DISCARD, f"salience {proposal.salience} < {floor}")
        return None

    def find_duplicate(self, content: str, existing: Sequence[Fact]) -> Fact | None:
        # A bounded set of the facts sharing the most words: the cost of judging a proposal
        # does not grow with the user's memory.
        existing = candidates(content, existing, lambda f: f.content)
        if not existing:
            return None
        canonical = canonical_form(content)
        for fact in existing:
            if canonical_form(fact.content) == canonical:
                return fact
        if self._embedder is None:
            return None
        vectors = self._embedder.embed([content, *(f.content for f in existing)])
        similarity = np.stack(vectors[1:]) @ vectors[0]
        best = int(np.argmax(similarity))
        return existing[best] if similarity[best] >= self._duplicate_cosine else None
