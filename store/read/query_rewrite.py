"""The optional query-rewrite hook: a callable given a hard time limit.

A chat turn's raw text ("and what about him?") is often a poor search query; a rewriter (a
small LLM call, say) can make it standalone. It must never cost the turn more than its time
limit nor fail it: on timeout or on `QueryRewriteFailed` the raw query is used. A call is
billed whether or not its answer was used: an unusable answer carries its usage, and a call
still running at the limit is handed back (`late`) for the read path to book once it ends.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from domain.errors import QueryRewriteFailed
from domain.model import TokenUsage

MAX_REWRITE_CHARS = 1_000


class RewriteOutcome(StrEnum):
    REWRITTEN = "rewritten"
    UNCHANGED = "unchanged"
    TIMEOUT = "timeout"
    FAILED = "failed"


@dataclass(frozen=True)
class Rewrite:
    query: str  # what retrieval uses
    outcome: RewriteOutcome
    usage: TokenUsage | None = None  # what the rewrite call cost, when it answered
    # The call still running when the turn stopped waiting for it (TIMEOUT).
    late: concurrent.futures.Future[RewriteAnswer] | None = field(default=None, compare=False)


# A rewriter answers with the text, or with the text and the tokens the call used (booked to
# the user's ledger by the read path).
RewriteAnswer = str | tuple[str, TokenUsage]


class TimeBoundRewriter:
    """Runs `rewrite` in a small thread pool and waits at most `timeout_s` for it.

    A rewrite that overruns keeps its worker busy until it returns, so the pool is bounded
    and a hung backend costs each turn `timeout_s`, never more.
    """

    def __init__(
        self, rewrite: Callable[[str], RewriteAnswer], timeout_s: float, *, workers: int = 4
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self._rewrite = rewrite
        self._timeout_s = timeout_s
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, "query-rewrite")

    def __call__(self, query: str) -> Rewrite:
        future = self._pool.submit(self._rewrite, query)
        try:
            answer = future.result(timeout=self._timeout_s)
        except concurrent.futures.TimeoutError:
            if future.cancel():  # never started: nothing was called, nothing to book
                return Rewrite(query, RewriteOutcome.TIMEOUT)
            return Rewrite(query, RewriteOutcome.TIMEOUT, late=future)
        except QueryRewriteFailed as e:
            return Rewrite(query, RewriteOutcome.FAILED, e.usage)
        text, usage = answer_usage(answer)
        text = " ".join(text.split())[:MAX_REWRITE_CHARS]
        if not text or text == query:
            return Rewrite(query, RewriteOutcome.UNCHANGED, usage)
        return Rewrite(text, RewriteOutcome.REWRITTEN, usage)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def answer_usage(answer: RewriteAnswer) -> tuple[str, TokenUsage | None]:
    return (answer, None) if isinstance(answer, str) else answer


def late_usage(future: concurrent.futures.Future[RewriteAnswer]) -> TokenUsage | None:
    """What a call the turn stopped waiting for cost, now that it has ended."""
    if future.cancelled():
        return None
    error = future.exception()
    if error is None:
        return answer_usage(future.result())[1]
    return error.usage if isinstance(error, QueryRewriteFailed) else None
