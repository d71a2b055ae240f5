"""What an erasure raises besides the store's errors."""

from __future__ import annotations

from store.errors import StoreError


class ErasureIncomplete(StoreError):
    """A step could not be verified (vectors left in the index); run the erasure again."""


class UnknownFact(LookupError):
    """The memory has no such fact, and no erasure of it to finish or to answer again."""
