"""Chroma clients: embedded or over HTTP, with the workarounds chromadb 1.5.9 needs.

The HTTP client is given a bounded request time (chromadb builds its httpx client without
one) and its sockets are closed on `close_client` (chromadb never closes them).
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path

import chromadb
import httpx
from chromadb.api import ClientAPI
from chromadb.api.client import Client
from chromadb.api.fastapi import FastAPI
from chromadb.config import Settings

from store.chroma._translate import CHROMA_FAILURES, translated
from store.errors import VectorIndexUnavailable
from store.service_urls import chroma_url

DEFAULT_HTTP_TIMEOUT_S = 10.0


def embedded_client(path: Path) -> ClientAPI:
    """A Chroma engine inside this process, persisted under path."""
    with translated("open"):
        return chromadb.PersistentClient(
            path=str(path), settings=Settings(anonymized_telemetry=False)
        )


def http_client(url: str, *, timeout_s: float = DEFAULT_HTTP_TIMEOUT_S) -> ClientAPI:
    """A client of a Chroma server at url (http(s)://host[:port]), with bounded request time.

    chromadb's HTTP client calls the server while it is constructed (tenant and database
    check), so this raises VectorIndexUnavailable when the server is down. Close it with
    `close_client`.
    """
    parsed = urllib.parse.urlsplit(chroma_url(url))
    host = parsed.hostname or ""  # chroma_url checked there is one
    ssl = parsed.scheme == "https"
    port = parsed.port or (443 if ssl else 8000)
    timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 5.0))
    # The construction-time check runs on a session we cannot give a timeout before it is
    # used; a bounded heartbeat first keeps a hung server from hanging the caller here.
    with translated("heartbeat"):
        httpx.get(f"{url.rstrip('/')}/api/v2/heartbeat", timeout=timeout).raise_for_status()
    try:
        client = chromadb.HttpClient(
            host=host,
            port=port,
            ssl=ssl,
            settings=Settings(anonymized_telemetry=False),
        )
    except ValueError as e:
        # chromadb reports a refused connection here as ValueError("Could not connect to a
        # Chroma server"), raised while handling the httpx error.
        if isinstance(e.__context__, CHROMA_FAILURES):
            raise VectorIndexUnavailable(f"chroma at {url} is unreachable: {e}") from e
        raise
    except CHROMA_FAILURES as e:
        raise VectorIndexUnavailable(f"chroma at {url} is unreachable: {e!r}") from e
    # chromadb builds its httpx client with timeout=None, so a hung server would hang every
    # caller; the session is private, but httpx's `timeout` setter is public.
    _http_session(client).timeout = timeout
    return client


def close_client(client: ClientAPI) -> None:
    """Release a client, and for the HTTP client close its sockets.

    chromadb never closes the httpx sessions of an HTTP client (its own and its internal admin
    client's), so their keep-alive sockets leak and raise ResourceWarning when collected.
    Every HTTP client has its own System, so closing its sessions affects no other client.
    """
    sessions = [
        _http_session(c) for c in (client, getattr(client, "_admin_client", None)) if _is_http(c)
    ]
    if isinstance(client, Client):  # ClientAPI itself declares no close()
        client.close()
    for session in sessions:
        session.close()


def _is_http(client: object) -> bool:
    return isinstance(getattr(client, "_server", None), FastAPI)


def _http_session(client: object) -> httpx.Client:
    session = getattr(getattr(client, "_server", None), "_session", None)
    if not isinstance(session, httpx.Client):
        raise TypeError(
            f"chromadb {chromadb.__version__} no longer keeps an httpx.Client at "
            "client._server._session; update store.chroma._client for it"
        )
    return session
