"""Errors raised by the store package.

Adapters translate driver exceptions into these at their boundary (`raise ... from e`), so
callers depend on one error per condition and never on chromadb, httpx or onnxruntime types.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base of every error the store package raises."""


class VectorIndexUnavailable(StoreError):
    """Chroma is unreachable or failed the request; the facts stay pending in Postgres."""


class EmbeddingModelMismatch(VectorIndexUnavailable):
    """The collection holds another embedding model's vectors than this process makes: the
    index is unusable to it, as in an outage (reads go without it, facts stay pending), until
    the setting is put right. Processes refuse to start on it when Chroma answers."""


class EmbeddingModelError(StoreError):
    """The embedding model or its tokenizer is missing, or the model file's hash is wrong."""


class JobFenced(StoreError):
    """A cluster job's run was superseded: its lock was lost and another process started the
    job since. Its transaction was refused; the run must stop (not be retried: the other run
    does the work)."""


class DatabaseUnavailable(StoreError):
    """Postgres is unreachable or dropped the connection; the operation may be retried."""


class DatabaseRefused(DatabaseUnavailable):
    """Postgres refused the work for a reason an operator fixes, not the work: a privilege
    revoked, a write to a read-only database (a standby after a failover). Retried as an
    outage is (a disk full or too many connections are `DatabaseUnavailable` already)."""


class MigrationError(StoreError):
    """The schema could not be brought to the version this code expects."""


class StaleMemoryVersion(StoreError):
    """Memory changed since the run read it; the run must be planned again on fresh state."""


class EventsAlreadyConsolidated(StoreError):
    """Another run consolidated some of these events first; nothing was written."""

    def __init__(self, event_ids: frozenset[object]) -> None:
        super().__init__(f"{len(event_ids)} event(s) already consolidated")
        self.event_ids = event_ids


class MemoryBeingErased(DatabaseUnavailable):
    """An erasure of this memory is under way; consolidating it waits until it completes
    (retried as an outage is: later, without counting an attempt)."""


class MemoryLockLost(DatabaseUnavailable):
    """The memory's lock was lost while held: its session ended (a dropped connection, a server
    restart, a pooler), so another process may hold it by now. The holder stops before its
    next step and is retried, as through an outage."""


class MemoryBusy(DatabaseUnavailable):
    """Another holds the memory's lock (a flush, an erasure) and the caller chose not to wait
    for it: it tries again later, as through an outage."""
