"""What every route of the API is given: its dependencies, the caller's organization (from
the bearer token), and the path and query parameters several routes share."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Path, Query, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import AfterValidator

from consumers.decoding import excerpt
from domain.ids import MemoryKey
from memoryd.api.auth import TokenTable
from memoryd.api.models import Problem, not_blank
from memoryd.api.query_batches import QueryBatches
from memoryd.erasure import Eraser
from producers.contract import ID_PATTERN, MAX_ID_CHARS, reject_nul
from producers.publisher import EventPublisher
from store.read.context_service import ContextService
from store.read.fact_queries import PostgresReadModel


@dataclass(frozen=True)
class ApiDependencies:
    context: ContextService
    reads: PostgresReadModel
    publisher: EventPublisher
    tokens: TokenTable
    eraser: Eraser
    # Chat turns' queries embedded in batches ahead of their reads; None embeds each in its
    # read (a query rewriter changes the text the read embeds).
    queries: QueryBatches | None = None


_bearer = HTTPBearer(auto_error=False, description="A token issued to one organization")


# The dependencies are async (they do no I/O): FastAPI runs a sync dependency in the thread
# pool, one hand-off per dependency per request, which under load costs more than they do.
async def _deps(request: Request) -> ApiDependencies:
    deps: ApiDependencies = request.app.state.deps
    return deps


Deps = Annotated[ApiDependencies, Depends(_deps)]


async def _organization(
    deps: Deps,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    org = None if credentials is None else deps.tokens.organization(credentials.credentials)
    if org is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "a valid bearer token is required",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return org


Organization = Annotated[str, Depends(_organization)]


def _no_nul_or_none(text: str | None) -> str | None:
    return None if text is None else reject_nul(text)


# A user id in a path is an event's user id: what no event can name has no memory either.
UserId = Annotated[str, Path(min_length=1, max_length=MAX_ID_CHARS, pattern=ID_PATTERN)]
# Not empty: with an empty key every later erasure would be a retry of the first one.
IdempotencyKey = Annotated[
    str | None, Query(min_length=1, max_length=200), AfterValidator(_no_nul_or_none)
]
Reason = Annotated[
    str,
    Query(min_length=1, max_length=500),
    AfterValidator(reject_nul),
    # The erasure audit refuses a reason of whitespace only: a 422 here, not a 500 there.
    AfterValidator(not_blank),
]

# Every route: no token, a dependency away; a body too large or unparsable, before any route.
UNAUTHORIZED: dict[int | str, dict[str, Any]] = {401: {"model": Problem}, 503: {"model": Problem}}
NOT_FOUND: dict[int | str, dict[str, Any]] = {**UNAUTHORIZED, 404: {"model": Problem}}


def known(deps: ApiDependencies, key: MemoryKey) -> None:
    """404 for a user the token's organization has no memory of."""
    if not deps.reads.known(key):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"unknown user {excerpt(key.user_id)}")


def no_such_fact(key: MemoryKey, fact_id: uuid.UUID) -> HTTPException:
    return HTTPException(
        status.HTTP_404_NOT_FOUND, f"user {excerpt(key.user_id)} has no fact {fact_id}"
    )
