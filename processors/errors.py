"""Errors of the consolidation logic and its backends.

The split matters to the consumer: a `TransientBackendError` is retried with backoff (a
`CredentialsRefused` waited out, as the backend being out), an `UnusableAnswer` makes it split
the batch to find the event at fault, any other `BackendError` goes straight to the
dead-letter path with its reason.

An error carries the tokens the failed call used: a model that answered, even with nothing
usable, was paid for, and the run record and the credit ledger book it.
"""

from domain.model import TokenUsage


class ProcessorError(Exception):
    """Base of every error raised by `processors`."""


class BackendError(ProcessorError):
    """The backend answered, but not with something memoryd can use. Not retried."""

    def __init__(
        self, message: str, raw_response: str | None = None, usage: TokenUsage | None = None
    ) -> None:
        super().__init__(message)
        self.raw_response = raw_response
        self.usage = usage or TokenUsage()


class UnusableAnswer(BackendError):
    """The model answered this input with no usable memory: unparseable, off-schema, blocked,
    empty or truncated. Another input may fare better: the consumer bisects the batch, so one
    bad event does not take the rest of its batch to the dead-letter topic."""


class TransientBackendError(BackendError):
    """Rate limit, server error or timeout: worth another attempt after a backoff.

    `retry_after_s`: how long the provider asked to be left alone (a quota's RetryInfo, a
    Retry-After header), if it said; the consumer waits at least that long, up to its cap.
    """

    def __init__(
        self,
        message: str,
        raw_response: str | None = None,
        usage: TokenUsage | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message, raw_response, usage)
        self.retry_after_s = retry_after_s


class CredentialsRefused(TransientBackendError):
    """The provider refuses memoryd's credentials, not the request: a key revoked, expired or
    restricted, the API disabled for its project, the project's billing lapsed. Every request
    fails alike until an operator fixes the key, whatever the batch, so the consumer waits it
    out as the backend being out and dead-letters nothing for it."""
