"""A shadow batch the model cannot answer usably is bisected as a live flush bisects it, and
every call the model answered is in the replay's tokens and cost."""

from __future__ import annotations

import pytest

from consumers.replay import ShadowBatch, batches_by_size, shadow_consolidate
from domain.model import RunStatus, TokenUsage
from processors.consolidate import Consolidator
from processors.cost import ModelPrice, PriceTable
from processors.errors import TransientBackendError, UnusableAnswer
from processors.gate import WriteGate
from processors.schema import ConsolidationRequest
from producers.contract import ContextEvent
from tests.support.builders import key_of, make_event
from tests.support.fakes import BagOfWordsEmbedder, FlakyBackend

POISON = "POISON"
USAGE = TokenUsage(prompt_tokens=300, completion_tokens=40)
ADA = key_of("ada")


class ChokesOn(FlakyBackend):
    """Answers unusably, and bills, any batch with a poison observation or more than
    `max_size` observations; after `transient_after` calls it is rate limited instead."""

    def __init__(self, max_size: int = 100, transient_after: int | None = None) -> None:
        super().__init__()
        self.max_size = max_size
        self.transient_after = transient_after

    def before(self, request: ConsolidationRequest) -> None:
        if self.transient_after is not None and self.calls > self.transient_after:
            raise TransientBackendError("429", usage=TokenUsage(prompt_tokens=7))
        texts = [o.event.content for o in request.observations]
        if any(POISON in t for t in texts) or len(texts) > self.max_size:
            raise UnusableAnswer("output is not JSON", raw_response="{", usage=USAGE)


def notes(n: int, poison_at: int | None = None) -> list[ContextEvent]:
    return [
        make_event("ada", f"{POISON} blob" if i == poison_at else f"I read chapter {i}", minutes=i)
        for i in range(n)
    ]


def consolidator() -> Consolidator:
    price = ModelPrice(input_usd_per_mtok=1.0, output_usd_per_mtok=10.0)
    return Consolidator(WriteGate(BagOfWordsEmbedder()), PriceTable({}, default=price))


@pytest.mark.parametrize("poison_at", [0, 5, 7])
def test_only_the_poison_event_fails_and_the_next_batch_builds_on_the_rest(
    poison_at: int,
) -> None:
    log = [*notes(8, poison_at), make_event("ada", "I read chapter 9 again", minutes=9)]
    backend = ChokesOn()
    result = shadow_consolidate(ADA, batches_by_size(log, 8), backend, consolidator())

    poison = log[poison_at].event_id
    assert [(f.event_ids, f.error) for f in result.failed] == [
        ((poison,), "output is not JSON (bisected out of a batch of 8)")
    ]
    good = {e.event_id for e in log[:8]} - {poison}
    assert [set(r.input_event_ids) for r in result.runs] == [good, {log[8].event_id}]
    # The batch after it was planned on memory that holds what the seven said.
    assert (backend.requests[-1].known_facts or 0) > 0


def test_events_that_fail_only_together_are_consolidated_apart() -> None:
    log = notes(8)
    result = shadow_consolidate(ADA, [ShadowBatch(tuple(log), log[-1].occurred_at)],
                                ChokesOn(max_size=4), consolidator())  # fmt: skip

    assert result.failed == ()
    assert sorted(e for r in result.runs for e in r.input_event_ids) == sorted(
        e.event_id for e in log
    )
    assert len(result.runs) > 1  # all together failed again: one run per clean group
    assert result.memory.version == len(result.runs)


def test_a_transient_error_while_bisecting_fails_what_no_run_took() -> None:
    log = notes(8, poison_at=6)
    result = shadow_consolidate(
        ADA, batches_by_size(log, 8), ChokesOn(transient_after=2), consolidator(),
        sleep=lambda _s: None,
    )  # fmt: skip

    assert result.runs == ()
    assert [(f.event_ids, f.error) for f in result.failed] == [
        (tuple(e.event_id for e in log), "429")
    ]


def test_every_call_the_model_answered_is_in_the_tokens_and_the_cost() -> None:
    backend = ChokesOn()
    prices = consolidator().prices
    result = shadow_consolidate(ADA, batches_by_size(notes(8, 5), 8), backend, consolidator())

    assert backend.calls == len(result.runs) + len(result.unapplied) > 2
    failed = [r for r in result.unapplied if r.status is RunStatus.FAILED]
    probes = [r for r in result.unapplied if r.status is RunStatus.DISCARDED]
    assert failed
    assert probes
    assert all(r.usage == USAGE for r in failed)
    calls = [*result.runs, *result.unapplied]
    assert result.prompt_tokens == sum(r.usage.prompt_tokens for r in calls)
    assert result.completion_tokens == sum(r.usage.completion_tokens for r in calls)
    assert result.cost_micro_usd == sum(prices.llm_cost_micro_usd(r.model, r.usage) for r in calls)
    assert result.cost_micro_usd > sum(r.cost_micro_usd for r in result.runs) > 0


def test_the_probe_of_the_only_clean_event_is_its_run_as_in_a_live_flush() -> None:
    a, poison = notes(2, poison_at=1)
    backend = ChokesOn()
    result = shadow_consolidate(ADA, batches_by_size([a, poison], 8), backend, consolidator())

    assert backend.calls == 3  # the batch, A's probe, the poison's probe: A is not asked again
    assert [r.input_event_ids for r in result.runs] == [(a.event_id,)]
    assert [r.status for r in result.unapplied] == [RunStatus.FAILED, RunStatus.FAILED]
    assert result.runs[0].usage.total > 0
    assert [f.event_ids for f in result.failed] == [(poison.event_id,)]
