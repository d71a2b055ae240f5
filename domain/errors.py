"""Errors shared across layers: raised by an adapter on one side of a port, caught on the other."""

from __future__ import annotations


class DomainError(Exception):
    """Base of every error the domain package defines."""


class QueryRewriteFailed(DomainError):
    """A query rewriter could not rewrite; the read path falls back to the raw query."""
