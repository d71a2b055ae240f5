"""Every way a failing Chroma shows itself to the client, turned into `VectorIndexUnavailable`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx
from chromadb.errors import ChromaError

from store.errors import VectorIndexUnavailable

# What a failing Chroma looks like from the client: its own errors (HTTP error bodies and the
# embedded Rust engine), httpx transport errors and timeouts, and raw socket errors.
CHROMA_FAILURES: tuple[type[Exception], ...] = (ChromaError, httpx.HTTPError, OSError)


@contextmanager
def translated(operation: str) -> Iterator[None]:
    try:
        yield
    except CHROMA_FAILURES as e:
        raise VectorIndexUnavailable(f"chroma {operation} failed: {e!r}") from e
    except Exception as e:
        # chromadb's HTTP client raises a bare Exception(response text) for error responses
        # without a Chroma error body (a proxy's 502, say). Only that exact type is Chroma's
        # failure; subclasses (TypeError, ValueError...) are our bugs and must surface as is.
        if type(e) is Exception:
            raise VectorIndexUnavailable(f"chroma {operation} failed: {e!r}") from e
        raise
