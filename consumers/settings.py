"""The processor's tuning, a typed settings model the composition root reads from the
environment (`MEMORYD_PROCESSOR__...`) and hands to the runtime as it is."""

from __future__ import annotations

from pydantic import BaseModel, Field

from consumers.flush import BudgetPolicy
from domain.retry import Backoff


class ProcessorSettings(BaseModel):
    max_batch: int = Field(default=20, ge=1)
    max_wait_s: float = Field(default=2.0, gt=0)
    concurrency: int = Field(default=4, ge=1)
    max_attempts: int = Field(default=4, ge=1)
    backoff_base_s: float = Field(default=0.5, gt=0)
    backoff_max_s: float = Field(default=30.0, gt=0)
    max_buffered: int = Field(default=5_000, ge=1)
    budget_policy: BudgetPolicy = BudgetPolicy.DEFER
    poll_timeout_ms: int = Field(default=200, ge=0)
    # How long a revocation waits for running flushes. It blocks kafka-python's IO thread (and
    # so heartbeats): keep it well below the session timeout.
    revoke_wait_s: float = Field(default=2.0, ge=0)

    @property
    def backoff(self) -> Backoff:
        """The wait before a batch's next attempt (`domain.retry`)."""
        return Backoff(self.backoff_base_s, self.backoff_max_s)
