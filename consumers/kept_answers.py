"""The backend's answers to a flush whose writes the database did not take, kept for the retry
of the same batch.

A write refused as an outage (a read-only database after a failover, a privilege revoked, the
connection lost) is waited out and the batch flushed again. Asking the backend again on every
retry would pay for a call per retry while the database refuses them all, and none of those
calls could be booked. So every answer a flush got is kept in the process, usable or not (a
failed run's record can be refused as a run's write can), with the request it answers, in the
order the flush asked; the retry takes each instead of calling: the call is paid for once, and
booked once, with the run it becomes or in its failed or discarded run's record. That record
has its run id from the call, so a retry writing it again books nothing twice, and a bisection
the outage cut short is gone through again without a call up to where it stopped.

An answer is reused only for the same memory, at the same version and generation, for the same
events, asked for as the same thing (a bisection's probe or a run): then nothing it was planned
on has changed (the version counts every run applied, the generation every erasure). Answers
the retry does not take are booked once it is over, as discarded (usable) or failed runs, or
dropped unbooked when an erasure came between. A crash loses the kept answers: the batch is
read again and consolidated by new calls, the only ones booked.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from consumers.log_fields import key_fields
from consumers.unapplied_runs import UnappliedRuns, log_unbooked
from domain.ids import MemoryKey, occurrence_run_id
from processors.errors import UnusableAnswer
from processors.schema import BackendResponse, ConsolidationRequest

log = logging.getLogger(__name__)

# Answers are kept for batches waiting out an outage, which backpressure bounds; a batch that
# left the processor (its partition revoked, its memory forgotten) leaves its answers until
# this many memories' are kept.
MAX_KEPT = 256


@dataclass(frozen=True)
class KeptAnswer:
    """A usable answer."""

    request: ConsolidationRequest
    response: BackendResponse
    duration_ms: int
    degraded: str | None  # the candidate search's degradation when the request was built
    generation: uuid.UUID | None
    probe: bool = False  # a bisection's probe: applied only when reused as one
    run_id: uuid.UUID = field(default_factory=occurrence_run_id)  # if recorded as discarded


@dataclass(frozen=True)
class KeptFailure:
    """An unusable answer, paid for all the same: its failed run books it."""

    request: ConsolidationRequest
    error: UnusableAnswer
    duration_ms: int
    generation: uuid.UUID | None
    probe: bool = False
    run_id: uuid.UUID = field(default_factory=occurrence_run_id)


Kept = KeptAnswer | KeptFailure


def _answers(kept: Kept, version: int, event_ids: frozenset[uuid.UUID], probe: bool) -> bool:
    """Whether `kept` answers these events at this version, asked for as the same thing."""
    return (
        kept.probe == probe
        and kept.request.state.version == version
        and kept.request.event_ids == event_ids
    )


@dataclass
class _Answers:
    """One memory's answers; touched by the thread flushing it only."""

    earlier: list[Kept] = field(default_factory=list)  # the tries before's, not taken yet
    made: list[Kept] = field(default_factory=list)  # this try's (or taken), in order
    # Run ids recorded as failed or discarded runs. A usable answer among them is never
    # applied after that: the call would be booked twice, as discarded and with the run.
    booked: set[uuid.UUID] = field(default_factory=set)


class KeptAnswers:
    def __init__(self, limit: int = MAX_KEPT) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._kept: OrderedDict[MemoryKey, _Answers] = OrderedDict()
        self._flushing: dict[MemoryKey, _Answers] = {}

    def __len__(self) -> int:
        """Memories with answers kept."""
        with self._lock:
            return len(self._kept)

    def begin(self, key: MemoryKey, generation: uuid.UUID | None) -> None:
        """Under the memory's lock, before its flush: its kept answers become the flush's to
        take. Those from before an erasure are neither applied nor recorded, as a run's
        record would bring back what the erasure took away. (A memory without a row had no
        generation: the first run gives it one. An erasure of it forgets the batch's events,
        which `settle` looks for.)"""
        with self._lock:
            kept = self._kept.pop(key, None) or _Answers()
            self._flushing[key] = _Answers(booked=kept.booked)
        for answer in kept.earlier:
            if answer.generation in (None, generation):
                self._flushing[key].earlier.append(answer)
            elif answer.run_id not in kept.booked:
                _unbooked(answer, "its memory was erased since the call")

    def take(
        self, key: MemoryKey, version: int, event_ids: Iterable[uuid.UUID], *, probe: bool
    ) -> Kept | None:
        """The first answer kept for exactly these events at this version, now this try's. A
        usable answer a try recorded as not applied is not one to apply: a probe's is taken
        (its bisection goes through again without a call; `booked` tells it not to apply it),
        a run's is not."""
        answers, ids = self._flushing[key], frozenset(event_ids)
        for n, answer in enumerate(answers.earlier):
            spent = isinstance(answer, KeptAnswer) and not probe and answer.run_id in answers.booked
            if not spent and _answers(answer, version, ids, probe):
                del answers.earlier[n]
                answers.made.append(answer)
                log.info("taking the answer kept from a refused write", extra=key_fields(key))
                return answer
        return None

    def made(self, answer: Kept) -> None:
        """An answer the flush got: kept should a write refuse it."""
        self._flushing[answer.request.key].made.append(answer)

    def applied(self, answer: KeptAnswer) -> None:
        """The answer's run is applied: nothing more to keep or book of it."""
        made = self._flushing[answer.request.key].made
        made[:] = [a for a in made if a is not answer]

    def booked(self, answer: Kept) -> bool:
        return answer.run_id in self._flushing[answer.request.key].booked

    def book(self, answer: Kept) -> None:
        """The answer's failed or discarded run is recorded: a retry does not record it again."""
        self._flushing[answer.request.key].booked.add(answer.run_id)

    def discard(self, answer: KeptAnswer, attempt: int, why: str, unapplied: UnappliedRuns) -> None:
        """Record a usable answer as not applied for `why` (once; never applied after)."""
        if self.booked(answer):
            return
        request = answer.request
        unapplied.discarded(
            request, attempt, request.now, answer.response, answer.duration_ms, why,
            run_id=answer.run_id,
        )  # fmt: skip
        self.book(answer)

    def keep(self, key: MemoryKey) -> None:
        """The flush raised an outage: its answers wait for its retry."""
        with self._lock:
            answers = self._flushing.pop(key, None)
            if answers is None or not (answers.made or answers.earlier):
                return
            self._kept[key] = _Answers([*answers.made, *answers.earlier], booked=answers.booked)
            over = len(self._kept) > self._limit
            evicted = self._kept.popitem(last=False)[1] if over else _Answers()
        for answer in evicted.earlier:
            if answer.run_id not in evicted.booked:
                _unbooked(answer, "too many answers kept")

    def settle(
        self,
        key: MemoryKey,
        attempt: int,
        batch: Iterable[uuid.UUID],
        left: Iterable[uuid.UUID],
        unapplied: UnappliedRuns,
    ) -> None:
        """Under the memory's lock, once its flush is over: the kept answers it did not take
        (the memory moved on, or their own write's COMMIT was lost), and this try's answers
        neither applied nor recorded (an error between the call and the record), are booked
        as discarded or failed runs (idempotent on their run ids). `batch`: the events of the
        batch flushed; `left`: those of them no erasure forgot. The answer to a forgotten
        event is not recorded (its record would bring the erased text back), nor one to events
        of another batch (kept when its partitions left this processor, or from a batch cut
        otherwise): whether an erasure came between is not known."""
        with self._lock:
            answers = self._flushing.pop(key, None) or _Answers()
        ours, kept_events = frozenset(batch), frozenset(left)
        for kept in [*answers.earlier, *answers.made]:
            if kept.run_id in answers.booked:
                continue
            if not kept.request.event_ids <= ours:
                _unbooked(kept, "its batch left this processor before the call was written")
            elif not kept.request.event_ids <= kept_events:
                _unbooked(kept, "some of its events were forgotten since the call")
            elif isinstance(kept, KeptFailure):
                unapplied.failed_unless_recorded(
                    kept.request, attempt, kept.error, kept.duration_ms, kept.run_id
                )
            else:
                unapplied.discarded_unless_applied(
                    kept.request,
                    attempt,
                    kept.request.now,
                    kept.response,
                    kept.duration_ms,
                    "not applied: the batch was not the same when its write was tried again",
                    run_id=kept.run_id,
                )

    def close(self) -> None:
        """The processor stops: the answers still kept (their batches waiting out an outage,
        or gone with their partitions) are paid for and will never be booked: said so."""
        with self._lock:
            kept, self._kept = self._kept, OrderedDict()
        for answers in kept.values():
            for answer in answers.earlier:
                if answer.run_id not in answers.booked:
                    _unbooked(answer, "the processor stopped with it kept")


def _unbooked(answer: Kept, why: str) -> None:
    usage = answer.error.usage if isinstance(answer, KeptFailure) else answer.response.usage
    log_unbooked(answer.request.key, usage.total, why)
