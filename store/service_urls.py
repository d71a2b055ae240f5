"""Checks of the addresses settings give for services, kept free of their clients' imports
(the settings are read before any client is loaded)."""

from __future__ import annotations

import urllib.parse


def chroma_url(url: str) -> str:
    """`url` if it names a Chroma server as `http_client` takes one; else ValueError."""
    parsed = urllib.parse.urlsplit(url)
    try:
        parsed.port  # noqa: B018 - a port that is no number raises here
    except ValueError as e:
        raise ValueError(f"chroma url has no valid port: {url!r}") from e
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"chroma url must be http(s)://host[:port], got {url!r}")
    if parsed.path not in ("", "/"):
        raise ValueError(f"chroma url must not have a path, got {url!r}")
    return url
