"""Errors of the consolidation logic and its backends.

The split matters to the consumer: a `TransientBackendError` is retried with backoff, any
other `BackendError` goes straight to the dead-letter path with its reason.
"""


class ProcessorError(Exception):
    """Base of every error raised by `processors`."""


class BackendError(ProcessorError):
    """The backend answered, but not with something memoryd can use. Not retried."""

    def __init__(self, message: str, raw_response: str | None = None) -> None:
        super().__init__(message)
        self.raw_response = raw_response


class TransientBackendError(BackendError):
    """Rate limit, server error or timeout: worth another attempt after a backoff."""
