"""Tier V in Chroma: the vector index adapter and its clients.

The client construction and chromadb's workarounds are private modules (`_client`,
`_translate`); what the rest of memoryd uses is named here.
"""

from store.chroma._client import close_client, embedded_client, http_client
from store.chroma.reconnecting_index import ReconnectingIndex
from store.chroma.vector_index import ChromaVectorIndex

__all__ = [
    "ChromaVectorIndex",
    "ReconnectingIndex",
    "close_client",
    "embedded_client",
    "http_client",
]
