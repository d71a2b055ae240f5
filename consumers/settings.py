"""The processor's tuning, a typed settings model the composition root reads from the
environment (`MEMORYD_PROCESSOR__...`) and hands to the runtime as it is."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from consumers.flush import BudgetPolicy
from consumers.splitting import MAX_SPLIT_CALLS
from domain.retry import Backoff
from processors.candidates import CandidatePolicy


class ProcessorSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_batch: int = Field(default=20, ge=1)
    max_wait_s: float = Field(default=2.0, gt=0)
    concurrency: int = Field(default=4, ge=1)
    max_attempts: int = Field(default=4, ge=1)
    backoff_base_s: float = Field(default=0.5, gt=0)
    backoff_max_s: float = Field(default=30.0, gt=0)
    # The longest wait a provider's own retry delay (RetryInfo, Retry-After) is honoured for:
    # a quota's is tens of seconds, and an absurd one must not park a batch for hours.
    backend_retry_max_s: float = Field(default=120.0, gt=0)
    # The backend is out (an outage, attempts not charged) once this many flushes in a row,
    # of more than one memory, failed transiently (consumers.backend_outage).
    backend_outage_after: int = Field(default=4, ge=2)
    # An outage told by that streak charges attempts again once it has lasted this long: two
    # poison batches with nothing else to flush look like one, and must not wait for good.
    backend_outage_max_s: float = Field(default=1_800.0, gt=0)
    max_buffered: int = Field(default=5_000, ge=1)
    budget_policy: BudgetPolicy = BudgetPolicy.DEFER
    # Existing facts shown to the backend: per observation (its most related), and prompt-
    # token budgets for them and for the pinned facts (processors.candidates).
    candidates_per_observation: int = Field(default=CandidatePolicy.per_observation, ge=0)
    candidate_tokens: int = Field(default=CandidatePolicy.max_tokens, ge=0)
    candidate_pinned_tokens: int = Field(default=CandidatePolicy.pinned_tokens, ge=0)
    # Probes to bisect a batch the model cannot answer usably (consumers.splitting).
    max_split_calls: int = Field(default=MAX_SPLIT_CALLS, ge=0)
    poll_timeout_ms: int = Field(default=200, ge=0)
    # How long the index thread may hold a write back while flushes are at work on the cores
    # (consumers.foreground); 0 writes at once.
    index_yield_ms: int = Field(default=100, ge=0)
    # How long a revocation waits for running flushes. It blocks kafka-python's IO thread (and
    # so heartbeats): keep it well below the session timeout.
    revoke_wait_s: float = Field(default=2.0, ge=0)

    @property
    def backoff(self) -> Backoff:
        """The wait before a batch's next attempt (`domain.retry`)."""
        return Backoff(self.backoff_base_s, self.backoff_max_s)

    @property
    def candidates(self) -> CandidatePolicy:
        """Which existing facts a flush shows its backend (`processors.candidates`)."""
        return CandidatePolicy(
            per_observation=self.candidates_per_observation,
            max_tokens=self.candidate_tokens,
            pinned_tokens=self.candidate_pinned_tokens,
        )
