"""Errors of the consolidation logic and its backends.

The split matters to the consumer: a `TransientBackendError` is retried with backoff (a
`CredentialsRefused` waited out, as the backend being out), an `UnusableAnswer` makes it split
the batch to find the event at fault, any other `BackendError` goes straight to the
dead-letter path with its reason.

An error carries the tokens the failed call used: a model that answered, even with nothing
usable, was paid for, and the run record and the credit ledger book it.
"""

from __future__ import annotations

from enum import StrEnum

from domain.model import TokenUsage


class BackendFailure(StrEnum):
    """What kind of failure a backend error is, a bounded class a metric can be labelled by
    (the message, free text, goes to the run record and the letter's reason)."""

    RATE_LIMITED = "rate_limited"  # a quota or rate limit (429)
    TIMEOUT = "timeout"  # the call or the provider's gateway timed out
    UNREACHABLE = "unreachable"  # no connection, or the connection dropped
    SERVER_ERROR = "server_error"  # a 5xx, or an HTTP answer broken on its way
    UNUSABLE_ANSWER = "unusable_answer"  # the model answered, with nothing usable
    REFUSED = "refused"  # the provider refused the request itself (a 4xx, configuration)

    @classmethod
    def of_status(cls, code: int) -> BackendFailure:
        """The kind of an HTTP error worth a retry: 429 a quota or rate limit, 408 and 504
        a timeout, any other the server's error."""
        timeouts = dict.fromkeys((408, 504), cls.TIMEOUT)
        return {429: cls.RATE_LIMITED, **timeouts}.get(code, cls.SERVER_ERROR)


class ProcessorError(Exception):
    """Base of every error raised by `processors`."""


class BackendError(ProcessorError):
    """The backend answered, but not with something memoryd can use. Not retried."""

    failure = BackendFailure.REFUSED  # each subclass's usual kind; an adapter may say better

    def __init__(
        self,
        message: str,
        raw_response: str | None = None,
        usage: TokenUsage | None = None,
        failure: BackendFailure | None = None,
    ) -> None:
        super().__init__(message)
        self.raw_response = raw_response
        self.usage = usage or TokenUsage()
        if failure is not None:
            self.failure = failure


class UnusableAnswer(BackendError):
    """The model answered this input with no usable memory: unparseable, off-schema, blocked,
    empty or truncated. Another input may fare better: the consumer bisects the batch, so one
    bad event does not take the rest of its batch to the dead-letter topic."""

    failure = BackendFailure.UNUSABLE_ANSWER


class TransientBackendError(BackendError):
    """Rate limit, server error or timeout: worth another attempt after a backoff.

    `retry_after_s`: how long the provider asked to be left alone (a quota's RetryInfo, a
    Retry-After header), if it said; the consumer waits at least that long, up to its cap.
    """

    failure = BackendFailure.SERVER_ERROR

    def __init__(
        self,
        message: str,
        raw_response: str | None = None,
        usage: TokenUsage | None = None,
        retry_after_s: float | None = None,
        failure: BackendFailure | None = None,
    ) -> None:
        super().__init__(message, raw_response, usage, failure)
        self.retry_after_s = retry_after_s


class CredentialsRefused(TransientBackendError):
    """The provider refuses memoryd's credentials, not the request: a key revoked, expired or
    restricted, the API disabled for its project, the project's billing lapsed. Every request
    fails alike until an operator fixes the key, whatever the batch, so the consumer waits it
    out as the backend being out and dead-letters nothing for it."""
