"""Retrieval metrics over LoCoMo evidence turns, and the evidence-id clean-up they rely on.

Pure functions over plain values. A system answers a question with a ranked list; each
position stands for the set of dialogue turns behind it (a memory fact may stand for several
turns, a raw-turn baseline for exactly one). Against the question's evidence turns:

- hit@k: 1 if any evidence turn is among the turns behind the top k positions, else 0;
- evidence recall@k: the fraction of the evidence turns found there.

A list shorter than k is scored as it is: what was not returned was not found.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Collection, Container, Iterable, Sequence
from dataclasses import dataclass

KS: tuple[int, ...] = (1, 3, 5, 10)
# The prompt budget hit@2000ch is measured at: characters of returned text, in rank order.
BUDGET_CHARS = 2_000
CATEGORIES: dict[int, str] = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
# LongMemEval's question types (bench/locomo/longmemeval.py numbers them 11-16).
GROUP_NAMES: dict[int, str] = {
    **CATEGORIES,
    11: "single-session-user",
    12: "single-session-assistant",
    13: "single-session-preference",
    14: "multi-session",
    15: "temporal-reasoning",
    16: "knowledge-update",
    19: "other question type",
}
OVERALL = "overall"

# "D8:6", and the malformed forms seen in the data: "D:11:26" (extra colon), "D30:05"
# (zero-padded turn). "D" alone, or anything else, is no id.
_DIA_ID = re.compile(r"D:?0*(\d+):0*(\d+)")
_SEPARATORS = re.compile(r"[\s;,]+")


def normalize_dia_id(token: str) -> str | None:
    """The canonical "D<session>:<turn>" of one id, or None when it is not one."""
    match = _DIA_ID.fullmatch(token.strip())
    if match is None:
        return None
    return f"D{int(match.group(1))}:{int(match.group(2))}"


def normalize_evidence(raw: Iterable[str], known: Container[str]) -> tuple[str, ...]:
    """Every id named by the evidence strings, canonical, deduplicated, in order.

    One string may hold several ids ("D8:6; D9:17", "D9:1 D4:4 D4:6"). Ids that are
    malformed beyond repair, or that point at no turn of the conversation, are dropped.
    """
    out: dict[str, None] = {}
    for item in raw:
        for token in _SEPARATORS.split(item):
            dia_id = normalize_dia_id(token) if token else None
            if dia_id is not None and dia_id in known:
                out[dia_id] = None
    return tuple(out)


Ranked = Sequence[Collection[str]]


def covered(ranked: Ranked, k: int) -> frozenset[str]:
    """The turns behind the top k positions."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return frozenset(turn for turns in ranked[:k] for turn in turns)


def hit_at_k(ranked: Ranked, evidence: Collection[str], k: int) -> float:
    _check(evidence)
    return 1.0 if covered(ranked, k) & set(evidence) else 0.0


def recall_at_k(ranked: Ranked, evidence: Collection[str], k: int) -> float:
    _check(evidence)
    wanted = set(evidence)
    return len(covered(ranked, k) & wanted) / len(wanted)


def covered_within(ranked: Ranked, sizes: Sequence[int], budget: int) -> frozenset[str]:
    """The turns behind the positions that fit, in rank order, in `budget` characters: the
    first position that does not fit ends the list, as a prompt cut there would."""
    out: set[str] = set()
    used = 0
    for turns, size in zip(ranked, sizes, strict=True):
        if used + size > budget:
            break
        used += size
        out.update(turns)
    return frozenset(out)


def hit_within(
    ranked: Ranked, sizes: Sequence[int], evidence: Collection[str], budget: int = BUDGET_CHARS
) -> float:
    _check(evidence)
    return 1.0 if covered_within(ranked, sizes, budget) & set(evidence) else 0.0


def _check(evidence: Collection[str]) -> None:
    if not evidence:
        raise ValueError("a question without evidence turns cannot be scored")


@dataclass(frozen=True)
class Answer:
    """What one system returned for one question."""

    system: str
    category: int
    evidence: tuple[str, ...]
    ranked: tuple[frozenset[str], ...]
    sizes: tuple[int, ...] = ()  # characters of text at each position (all of it, not top k)


@dataclass(frozen=True)
class Summary:
    system: str
    group: str  # a category name or OVERALL
    questions: int
    hit: dict[int, float]
    recall: dict[int, float]
    turns: dict[int, float]  # mean number of distinct turns behind the top k
    hit_budget: float = 0.0  # hit within BUDGET_CHARS characters of returned text


def summarize(answers: Iterable[Answer], ks: Sequence[int] = KS) -> list[Summary]:
    """Means per (system, category) and per system overall, in a stable order."""
    groups: dict[tuple[str, str], list[Answer]] = {}
    for answer in answers:
        name = GROUP_NAMES.get(answer.category, f"category {answer.category}")
        groups.setdefault((answer.system, name), []).append(answer)
        groups.setdefault((answer.system, OVERALL), []).append(answer)
    order = [*GROUP_NAMES.values(), OVERALL]

    def position(key: tuple[str, str]) -> tuple[str, int, str]:
        system, group = key
        return (system, order.index(group) if group in order else len(order), group)

    return [
        Summary(
            system=system,
            group=group,
            questions=len(members),
            hit={
                k: statistics.fmean(hit_at_k(a.ranked, a.evidence, k) for a in members) for k in ks
            },
            recall={
                k: statistics.fmean(recall_at_k(a.ranked, a.evidence, k) for a in members)
                for k in ks
            },
            turns={k: statistics.fmean(len(covered(a.ranked, k)) for a in members) for k in ks},
            # Answers that came without sizes cannot be scored by characters: they count as 0.
            hit_budget=statistics.fmean(
                hit_within(a.ranked, a.sizes, a.evidence) if a.sizes else 0.0 for a in members
            ),
        )
        for (system, group), members in sorted(groups.items(), key=lambda kv: position(kv[0]))
    ]


def markdown_table(
    headers: Sequence[str], rows: Iterable[Sequence[object]], *, left: int = 1
) -> str:
    """The first `left` columns are aligned left (labels), the others right (numbers)."""
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---" if i < left else "--:" for i in range(len(headers))) + "|",
    ]
    lines.extend("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows)
    return "\n".join(lines)


def metric_table(
    summaries: Sequence[Summary],
    metric: str,
    systems: Sequence[str],
    ks: Sequence[int] = KS,
    digits: int = 3,
) -> str:
    """One row per (category, system): `metric` is "hit", "recall" or "turns"."""
    by_key = {(s.group, s.system): s for s in summaries}
    groups = list(dict.fromkeys(s.group for s in summaries))
    rows = []
    for group in groups:
        for system in systems:
            s = by_key.get((group, system))
            if s is None:
                continue
            values = getattr(s, metric)
            rows.append([group, system, s.questions, *(f"{values[k]:.{digits}f}" for k in ks)])
    headers = ["category", "system", "questions", *(f"@{k}" for k in ks)]
    return markdown_table(headers, rows, left=2)
