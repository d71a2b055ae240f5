"""The stores and the vector index in process memory, for unit tests and local experiments.

Like eventsourcing's POPO recorders: the same ports (`domain.ports`) and the same observable
behaviour as the Postgres and Chroma adapters, which the contract suites in `tests/contracts/`
check against both. One `InMemoryDatabase` stands for one Postgres database: the adapters over
it see each other's writes, as the Postgres adapters over one pool do.
"""

from store.inmemory.database import InMemoryDatabase
from store.inmemory.fact_search import InMemoryFactSearch
from store.inmemory.indexed_facts import InMemoryIndexedFacts
from store.inmemory.logs import InMemoryEventLog, InMemoryRunLog
from store.inmemory.memory_store import InMemoryMemoryStore
from store.inmemory.read_model import InMemoryReadModel
from store.inmemory.vector_index import InMemoryVectorIndex

__all__ = [
    "InMemoryDatabase",
    "InMemoryEventLog",
    "InMemoryFactSearch",
    "InMemoryIndexedFacts",
    "InMemoryMemoryStore",
    "InMemoryReadModel",
    "InMemoryRunLog",
    "InMemoryVectorIndex",
]
