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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


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
