"""Errors of the consumer runtimes."""


class ConsumerError(Exception):
    """Base of every error raised by `consumers`."""


class DeadLetterError(ConsumerError):
    """A record could not be written to the dead-letter topic; its offset must not advance."""
