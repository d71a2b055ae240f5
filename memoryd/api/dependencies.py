"""What every route of the API is given: its dependencies, the caller's organization (from
the bearer token), and the path and query parameters several routes share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Query, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import AfterValidator

from memoryd.api.auth import TokenTable
from memoryd.api.models import not_blank
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
