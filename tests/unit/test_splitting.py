"""Bisecting a failed batch: who is isolated, what stays clean, how many probes it costs, and
what becomes of each probe's usable answer."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from consumers.splitting import Answered, consolidate_isolated, isolate


class Model:
    """Fails any group holding a poison item; or, with `max_size`, any group larger than it."""

    def __init__(self, poison: Sequence[int] = (), max_size: int | None = None) -> None:
        self.poison = set(poison)
        self.max_size = max_size
        self.probes: list[tuple[int, ...]] = []

    def __call__(self, group: Sequence[int]) -> str | None:
        self.probes.append(tuple(group))
        bad = sorted(self.poison & set(group))
        if bad:
            return f"choked on {bad[0]}"
        if self.max_size is not None and len(group) > self.max_size:
            return "too long together"
        return None


@pytest.mark.parametrize("poison", [0, 1, 7, 13, 19])
def test_one_poison_item_is_isolated_and_everything_else_is_clean(poison: int) -> None:
    model = Model([poison])
    found = isolate(range(20), "batch failed", model, max_calls=12)

    assert found.failing == (((poison,), f"choked on {poison}"),)
    assert sorted(i for g in found.clean for i in g) == [i for i in range(20) if i != poison]
    # About two probes per halving (fewer when a clean half spares its sibling's probe).
    assert found.calls == len(model.probes) <= 10
    assert all(len(p) < 20 for p in model.probes), "the whole batch is never probed again"


@pytest.mark.parametrize(
    ("size", "poison", "probes"),
    [
        (2, 0, 2),  # the poison's half fails, so its sibling must be probed too
        (2, 1, 2),  # the left half answers; the single right one is probed to confirm
        (3, 2, 3),  # (0) answers, so (1, 2) is split unprobed: (1) answers, (2) confirmed
        (4, 3, 3),
        (4, 0, 4),  # (0, 1) fails, (2, 3) probed and clean; (0) fails, (1) probed
    ],
)
def test_probe_counts_on_small_batches(size: int, poison: int, probes: int) -> None:
    found = isolate(range(size), "failed", Model([poison]), max_calls=12)
    assert found.failing == (((poison,), f"choked on {poison}"),)
    assert found.calls == probes


def test_two_poison_items_are_both_isolated() -> None:
    found = isolate(range(20), "failed", Model([3, 16]), max_calls=20)
    assert [g for g, _ in found.failing] == [(3,), (16,)]
    assert sum(len(g) for g in found.clean) == 18


def test_a_model_that_fails_everything_costs_at_most_max_calls() -> None:
    model = Model(poison=range(20))
    found = isolate(range(20), "failed", model, max_calls=6)

    assert found.calls == len(model.probes) == 6
    assert not found.clean
    # Everything is dead-lettered, in groups once the probes ran out, each with a reason.
    assert sorted(i for g, _ in found.failing for i in g) == list(range(20))
    assert all(why.startswith("choked on") or why == "failed" for _, why in found.failing)


def test_groups_that_fail_only_together_come_out_clean() -> None:
    """No single culprit: every part answers alone (the caller then consolidates the parts
    together, and apart if that fails again). Nothing is dead-lettered."""
    found = isolate(range(8), "too long together", Model(max_size=4), max_calls=12)
    assert found.failing == ()
    assert [i for g in found.clean for i in g] == list(range(8))


def test_groups_come_back_in_batch_order() -> None:
    found = isolate(list("abcdefgh"), "failed", Model(), max_calls=12)
    assert [x for g in found.clean for x in g] == list("abcdefgh")


def test_no_probes_means_the_batch_fails_as_it_did() -> None:
    model = Model([5])
    found = isolate(range(10), "the batch failed", model, max_calls=0)
    assert found.failing == ((tuple(range(10)), "the batch failed"),)
    assert model.probes == []


def test_a_probe_that_raises_decides_nothing() -> None:
    def flaky(group: Sequence[int]) -> str | None:
        raise TimeoutError("rate limited")

    with pytest.raises(TimeoutError):
        isolate(range(4), "failed", flaky, max_calls=12)


class Answers:
    """A caller of `consolidate_isolated`: a probe's usable answer is its group's name."""

    def __init__(self, model: Model, *, reusable: bool = True) -> None:
        self.model = model
        self.reusable = reusable
        self.consolidated: list[tuple[int, ...]] = []
        self.reused: list[str] = []
        self.discarded: list[str] = []

    def probe(self, group: Sequence[int]) -> str | Answered[str]:
        why = self.model(group)
        return why if why is not None else Answered(f"answer to {tuple(group)}")

    def consolidate(self, group: Sequence[int]) -> tuple[int, ...]:
        self.consolidated.append(tuple(group))
        return tuple(group)

    def reuse(self, group: Sequence[int], answer: str) -> tuple[int, ...] | None:
        if not self.reusable:
            return None
        self.reused.append(answer)
        return tuple(group)

    def run(self, items: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        found = consolidate_isolated(
            items, "failed", self.probe, self.consolidate, max_calls=12,
            reuse=self.reuse, discard=self.discarded.append,
        )  # fmt: skip
        return found.done


def test_the_answer_of_the_only_clean_group_is_applied_not_asked_again() -> None:
    answers = Answers(Model([1]))
    assert answers.run(range(2)) == ((0,),)
    assert (answers.reused, answers.discarded, answers.consolidated) == (["answer to (0,)"], [], [])


def test_a_probe_answer_the_memory_moved_past_is_discarded_and_asked_again() -> None:
    answers = Answers(Model([1]), reusable=False)
    assert answers.run(range(2)) == ((0,),)
    assert (answers.discarded, answers.consolidated) == (["answer to (0,)"], [(0,)])


def test_with_two_clean_groups_both_answers_are_discarded_and_they_run_together() -> None:
    answers = Answers(Model([2]))
    assert answers.run(range(3)) == ((0, 1),)
    assert answers.reused == []
    assert answers.discarded == ["answer to (0,)", "answer to (1,)"]
    assert answers.consolidated == [(0, 1)]


def test_a_held_answer_is_discarded_when_a_later_probe_raises() -> None:
    answers = Answers(Model())

    def probe(group: Sequence[int]) -> str | Answered[str]:
        if 1 in group:
            raise TimeoutError("rate limited")
        return answers.probe(group)

    with pytest.raises(TimeoutError):
        consolidate_isolated(
            range(2), "failed", probe, answers.consolidate, max_calls=12,
            reuse=answers.reuse, discard=answers.discarded.append,
        )  # fmt: skip
    assert answers.discarded == ["answer to (0,)"]
    assert answers.consolidated == answers.reused == []
