"""Bearer tokens scoped to one organization.

Settings hold only the sha256 of each token, mapped to its organization, so neither the
settings file nor the environment holds a usable secret. A token acts for its organization
only: every route checks that the user it names belongs to that organization.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

_HEX_DIGEST_CHARS = 64


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenTable:
    def __init__(self, digests: Mapping[str, str]) -> None:
        for digest in digests:
            if len(digest) != _HEX_DIGEST_CHARS or not all(c in "0123456789abcdef" for c in digest):
                raise ValueError("api tokens must be configured as lowercase sha256 hex digests")
        self._digests = dict(digests)

    def organization(self, token: str) -> str | None:
        """The organization a token acts for, None for an unknown token."""
        digest = hash_token(token)
        # Compared in constant time against every entry: the lookup must not tell a caller
        # how close a guess came, even through a dict's timing.
        found = None
        for known, org in self._digests.items():
            if hmac.compare_digest(known, digest):
                found = org
        return found
