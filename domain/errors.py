"""Errors shared across layers: raised by an adapter on one side of a port, caught on the other."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the model imports nothing of errors, but errors stay import-light
    from domain.model import TokenUsage


class DomainError(Exception):
    """Base of every error the domain package defines."""


class QueryRewriteFailed(DomainError):
    """A query rewriter could not rewrite; the read path falls back to the raw query.

    `usage`: what the call cost when it was answered, unusably (no text, blocked): it was
    billed all the same, and the read path books it.
    """

    def __init__(self, message: str, usage: TokenUsage | None = None) -> None:
        super().__init__(message)
        self.usage = usage
