"""A memory's credit line, read again before each further call of a bisected batch.

The flush reads the balance once, under the memory's lock, before its first call. A batch the
model cannot answer is then bisected (`consumers.splitting`): up to `MAX_SPLIT_CALLS` probes
and the consolidations after them, each paid for, none of which that reading shows. So before
each further call the balance is read again, less what answers held back from the ledger (a
probe's answer that may yet be applied) cost, and the budget policy applies once it is spent:
DEFER stops the bisection (`CreditSpent`), SKIP_EMBEDDINGS carries on and the runs from then
on are consolidated as out of credit.
"""

from __future__ import annotations

from consumers.errors import ConsumerError
from domain.ids import MemoryKey
from domain.ports import MemoryStore
from processors.cost import PriceTable
from processors.schema import BackendResponse


class CreditSpent(ConsumerError):
    """The credit line ran out during a bisection and the policy defers: no further call."""


class CreditLine:
    def __init__(
        self,
        store: MemoryStore,
        key: MemoryKey,
        prices: PriceTable,
        balance: int | None,
        *,
        defer: bool,
    ) -> None:
        self._store = store
        self._key = key
        self._prices = prices
        self._limited = balance is not None  # None: no credit line, nothing to read again
        self._defer = defer
        self._unbooked = 0  # micro-USD of answers paid for and not in the ledger yet
        self.spent = balance is not None and balance <= 0

    def before_call(self) -> None:
        """Raises CreditSpent when the balance is spent and the policy defers."""
        if not self._limited or self.spent:
            return
        balance = self._store.balance(self._key)
        if balance is None or balance - self._unbooked > 0:
            return
        if self._defer:
            raise CreditSpent(f"balance {balance - self._unbooked} micro-USD while bisecting")
        self.spent = True

    def held(self, response: BackendResponse) -> None:
        """An answer paid for and not booked yet."""
        self._unbooked += self._cost(response)

    def booked(self, response: BackendResponse) -> None:
        """An answer `held` is in the ledger now (or on its way with the run applying it)."""
        self._unbooked -= self._cost(response)

    def _cost(self, response: BackendResponse) -> int:
        return self._prices.llm_cost_micro_usd(response.model, response.usage)
