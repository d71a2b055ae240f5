"""Errors a producer raises to the service that embeds it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class ProducerError(Exception):
    """Base of every error raised by `producers`."""


@dataclass(frozen=True)
class Undelivered:
    """One event of a publish that the broker did not acknowledge.

    `retriable` False means the broker (or the client, before sending) refused the record for
    what it is, a record too large for the topic say: the same record is refused again. True
    means it was not acknowledged in time or the broker was away; it may even have been
    written, and sending it again is safe, since `event_id` is the idempotency key downstream.
    """

    position: int  # in the events given to `publish`
    reason: str
    retriable: bool


class PublishError(ProducerError):
    """An event was not acknowledged by the broker in time; the caller decides to retry.

    Retrying with the same events is safe: `event_id` is the idempotency key downstream.
    `undelivered` names the events of a batch that were not acknowledged (the others were);
    empty, the error says nothing about which.
    """

    def __init__(self, message: str, undelivered: Sequence[Undelivered] = ()) -> None:
        super().__init__(message)
        self.undelivered = tuple(undelivered)
