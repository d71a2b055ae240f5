"""Bisecting a batch the model could not answer, to find the events at fault.

One event can make a whole batch unanswerable: a blob that truncates the answer, text a
safety filter blocks. Rather than dead-letter the other events with it, the batch is cut in
halves and each half is tried alone (a probe: the answer is checked, not applied), down to
single events. What answers usably is consolidated afterwards, together, in one run; only
what fails alone is dead-lettered.

A half is not probed when its sibling answered and it is larger than one event: with the
sibling clean, the parent's failure is most likely in it, and probing its own halves tells as
much. A single event is always probed: a dead letter states the event's own failure.

`max_calls` bounds the probes: a model that fails on everything would otherwise cost 2n-1
calls per batch of n. What is still unresolved when they are spent fails as a group, with
the last failure seen for it.

`consolidate_isolated` is the whole strategy, shared by the live flush and the shadow replay
so that a replay drops exactly the events a live flush would dead-letter: bisect, then
consolidate the clean groups together, or one group a run if together they fail again.

When the clean groups are one probed group, its consolidation would ask the very request its
probe asked (probes apply nothing, so the memory is as the probe saw it): the probe's answer
is applied instead, and that call is paid for once. A probe's answer is therefore held, not
recorded, while it may still be the only clean group; once a second group answers, neither
can be, and both are recorded as discarded at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from processors.errors import UnusableAnswer

T = TypeVar("T")
R = TypeVar("R")
A = TypeVar("A")

# Enough probes to isolate one failing event in a batch of up to 64.
MAX_SPLIT_CALLS = 12
# What a probe that answered usably is recorded with when it is not applied: paid for.
PROBE_NOTE = "usable answer to a probe while bisecting a batch; its events were consolidated later"


@dataclass(frozen=True)
class Isolation(Generic[T]):
    clean: tuple[tuple[T, ...], ...]  # groups that answered usably, in batch order
    failing: tuple[tuple[tuple[T, ...], str], ...]  # (group, its failure), in batch order
    calls: int = 0  # probes made


def isolate(
    items: Sequence[T],
    failure: str,
    probe: Callable[[Sequence[T]], str | None],
    max_calls: int,
) -> Isolation[T]:
    """Bisect `items`, which failed together with `failure`.

    `probe` tries a group alone and returns None when it was answered usably, else why not;
    it may raise (a transient error, say), and then nothing is decided here.
    """
    clean: list[tuple[int, tuple[T, ...]]] = []
    failing: list[tuple[int, tuple[T, ...], str]] = []
    calls = 0
    # (offset in the batch, group, why it failed); groups known or inferred to fail.
    pending: list[tuple[int, tuple[T, ...], str]] = [(0, tuple(items), failure)]
    while pending:
        offset, group, why = pending.pop()
        if len(group) == 1 or calls >= max_calls:
            failing.append((offset, group, why))
            continue
        middle = len(group) // 2
        halves = ((offset, group[:middle]), (offset + middle, group[middle:]))
        found: list[tuple[int, tuple[T, ...], str]] = []
        left_clean = False
        for n, (start, half) in enumerate(halves):
            if n == 1 and left_clean and len(half) > 1:
                found.append((start, half, why))
                continue
            if calls >= max_calls:
                found.append((start, half, why))
                continue
            calls += 1
            outcome = probe(half)
            if outcome is None:
                clean.append((start, half))
                left_clean = n == 0
            else:
                found.append((start, half, outcome))
        # Reversed, so the leftmost group is resolved first.
        pending.extend(reversed(found))
    return Isolation(
        clean=tuple(g for _, g in sorted(clean, key=lambda x: x[0])),
        failing=tuple((g, why) for _, g, why in sorted(failing, key=lambda x: x[0])),
        calls=calls,
    )


@dataclass(frozen=True)
class Consolidated(Generic[T, R]):
    done: tuple[R, ...]  # what each consolidation that went through returned, in order
    failing: tuple[tuple[tuple[T, ...], str], ...]  # failed alone when bisected, in batch order
    # Answered alone as probes, then unusable in a run of their own: (group, its failure).
    unanswered: tuple[tuple[tuple[T, ...], str], ...] = ()


@dataclass(frozen=True)
class Answered(Generic[A]):
    """A probe's usable answer, as the caller needs it to apply or to record it."""

    answer: A


def consolidate_isolated(
    items: Sequence[T],
    failure: str,
    probe: Callable[[Sequence[T]], str | Answered[A]],
    consolidate: Callable[[Sequence[T]], R],
    max_calls: int,
    *,
    reuse: Callable[[Sequence[T], A], R | None],
    discard: Callable[[A], None],
    keeps: type[BaseException] | tuple[type[BaseException], ...] = (),
) -> Consolidated[T, R]:
    """`isolate` the events at fault in `items`, then consolidate what answered usably.

    `probe` tries a group alone and returns why its answer was unusable, or the answer.
    `consolidate` runs one group of events and applies it, or raises `UnusableAnswer`; it is
    called on the clean groups together first, and, should that fail (each group answered
    alone, not all together), once per clean group in batch order, each on the memory the
    runs before it left. `reuse` applies a probe's answer to its group as `consolidate`
    would, or returns None when the memory changed since the probe (then the group is
    consolidated); an answer given to `reuse` is its to record, should it raise. `discard`
    records a probe's answer that is not applied: every other answer is, whatever is
    raised, but `keeps`: the caller keeps the answers held when one of these is raised (a
    database outage: the retry applies them, so recording one as not applied would book its
    call twice). Any other error of `probe`, `consolidate` or `reuse` is raised.
    """
    held: list[tuple[tuple[T, ...], A]] = []  # at most one: it may still be reused
    several = False

    def probed(group: Sequence[T]) -> str | None:
        nonlocal several
        outcome = probe(group)
        if isinstance(outcome, str):
            return outcome
        held.append((tuple(group), outcome.answer))
        if several or len(held) > 1:
            several = True
            while held:
                discard(held.pop(0)[1])
        return None

    try:
        found = isolate(items, failure, probed, max_calls)
        done: list[R] = []
        unanswered: list[tuple[tuple[T, ...], str]] = []
        if held and found.clean == (held[0][0],):
            group, answer = held.pop()
            try:
                reused = reuse(group, answer)
            except UnusableAnswer as e:  # as `consolidate` of the group alone would end
                return Consolidated((), found.failing, ((group, str(e)),))
            if reused is not None:
                return Consolidated((reused,), found.failing)
            discard(answer)
    except keeps:
        held.clear()  # the caller's now
        raise
    finally:
        while held:
            discard(held.pop()[1])
    good = [x for group in found.clean for x in group]
    if good:
        try:
            done.append(consolidate(good))
        except UnusableAnswer:
            for group in found.clean:
                try:
                    done.append(consolidate(group))
                except UnusableAnswer as e:
                    unanswered.append((group, str(e)))
    return Consolidated(tuple(done), found.failing, tuple(unanswered))
