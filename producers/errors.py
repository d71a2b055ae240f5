"""Errors a producer raises to the service that embeds it."""


class ProducerError(Exception):
    """Base of every error raised by `producers`."""


class PublishError(ProducerError):
    """An event was not acknowledged by the broker in time; the caller decides to retry.

    Retrying with the same events is safe: `event_id` is the idempotency key downstream.
    """
