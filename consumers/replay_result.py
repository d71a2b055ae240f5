"""What a shadow replay comes back with: the image it folded, its runs, what failed, and
every call that became no run, with what each cost; or, stopped by a refusal of the
credentials, what it made until then."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from consumers.errors import ConsumerError
from domain.model import RunRecord
from processors.fold import FoldedMemory


@dataclass(frozen=True)
class FailedBatch:
    event_ids: tuple[uuid.UUID, ...]
    error: str


@dataclass(frozen=True)
class ShadowResult:
    memory: FoldedMemory
    runs: tuple[RunRecord, ...]
    failed: tuple[FailedBatch, ...]
    # Every call that became no run (an unusable answer, an error, a probe's usable answer
    # not applied), as a failed or discarded run with the tokens the backend said it used: a
    # model that answered was paid for, so the replay's cost counts them.
    unapplied: tuple[RunRecord, ...] = ()
    # The recorded maintenance runs made again (those that changed the shadow).
    maintenance: tuple[RunRecord, ...] = ()

    @property
    def calls(self) -> tuple[RunRecord, ...]:
        return (*self.runs, *self.unapplied)

    @property
    def prompt_tokens(self) -> int:
        return sum(r.usage.prompt_tokens for r in self.calls)

    @property
    def completion_tokens(self) -> int:
        return sum(r.usage.completion_tokens for r in self.calls)

    @property
    def cost_micro_usd(self) -> int:
        return sum(r.cost_micro_usd for r in self.calls)


class ReplayStopped(ConsumerError):
    """The backend refused memoryd's credentials (`CredentialsRefused`): every later call would
    be refused alike, whatever its batch, so the replay stopped at that call rather than fail
    each batch in turn. `partial`: what it made until then, with every call it paid for."""

    def __init__(self, reason: str, partial: ShadowResult) -> None:
        super().__init__(reason)
        self.partial = partial
