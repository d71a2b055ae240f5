"""Pages of a memory's facts for `GET /v1/users/{user_id}/memory`.

Keyset paging: a page's cursor names its last fact by (created_at, fact_id), the order facts
are listed in, and the next page starts after it. A fact's place never moves, so paging
through a memory that changes meanwhile lists no fact twice (one learned meanwhile comes on
a later page; one whose status changes may leave or join a filtered listing).
"""

from __future__ import annotations

import binascii
import uuid
from base64 import urlsafe_b64decode, urlsafe_b64encode
from datetime import datetime
from typing import Annotated

from fastapi import Query
from pydantic import AfterValidator

from domain.model import Fact

DEFAULT_PAGE = 500
MAX_PAGE = 5_000


def cursor_of(fact: Fact) -> str:
    """The cursor of the page that ends with `fact` (opaque to callers)."""
    text = f"{fact.created_at.isoformat()}|{fact.fact_id}"
    return urlsafe_b64encode(text.encode()).decode().rstrip("=")


def position(cursor: str) -> tuple[datetime, uuid.UUID]:
    """The (created_at, fact_id) a cursor names; ValueError for one no page handed out."""
    try:
        text = urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created, fact_id = text.split("|")
        at = datetime.fromisoformat(created)
        if at.tzinfo is None:
            raise ValueError("no time zone")
        return at, uuid.UUID(fact_id)
    except (ValueError, binascii.Error) as e:  # UnicodeDecodeError is a ValueError
        raise ValueError("not a cursor a page of facts handed out") from e


def _a_cursor(cursor: str | None) -> str | None:
    if cursor is not None:
        position(cursor)
    return cursor


Cursor = Annotated[str | None, Query(min_length=1, max_length=200), AfterValidator(_a_cursor)]
PageSize = Annotated[int, Query(ge=1, le=MAX_PAGE)]
