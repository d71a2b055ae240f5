"""The FastAPI application: context for a turn, memory inspection, corrections, events,
erasure.

Endpoints are plain `def`s: the clients underneath (psycopg, chromadb, kafka-python) are
synchronous, and FastAPI runs such endpoints in its thread pool. Chat turns and erasures run
on threads of their own instead (`turn_threads`, `erasure_threads`), the health checks on
none. Every route but the health check needs a bearer token, and a token's organization is
the only one it can touch: a `user_id` in a path or body names that organization's user, so
another organization's user of the same id is simply another memory, out of reach.
A chat turn's `POST /v1/context` that FastAPI would accept is answered by
`memoryd.api.turn_lane` without the router, through the same `serve_turn`; every other request
to it, and every other route, is FastAPI's.
Corrections and events go to Kafka as events, never to Postgres directly: the API answers
202 once Kafka has them, and memory changes when the pipeline has run. Erasures (a user, a
fact) are done before the answer, which carries their receipt; one whose memory a flush holds
past `API__ERASURE_LOCK_WAIT_S` is audited, answered 202, and finished by the processors.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Annotated, Any

from anyio import CapacityLimiter, to_thread
from fastapi import FastAPI, HTTPException, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from prometheus_client import CollectorRegistry
from starlette.concurrency import run_in_threadpool

from consumers.decoding import excerpt
from domain.ids import MemoryKey, turn_log_id_for
from domain.model import Fact, FactStatus
from memoryd.api.body_limit import BodyLimit
from memoryd.api.dependencies import (
    ApiDependencies,
    Deps,
    IdempotencyKey,
    Organization,
    Reason,
    UserId,
)
from memoryd.api.errors import validation_problems
from memoryd.api.event_batches import NOT_ALL_ACCEPTED, not_accepted_answer
from memoryd.api.health import add_health_routes
from memoryd.api.metrics import HttpMetrics, RequestLatencyMiddleware
from memoryd.api.models import (
    Accepted,
    ContextRequest,
    ContextResponse,
    CorrectionRequest,
    ErasureOut,
    EventsRequest,
    FactOut,
    MemoryResponse,
    Problem,
)
from memoryd.api.pages import DEFAULT_PAGE, Cursor, PageSize, cursor_of, position
from memoryd.api.turn_lane import TurnLane
from memoryd.erasure import ErasureIncomplete, ErasureRequest, Outcome, UnknownFact
from memoryd.ops.health import HealthMonitor
from memoryd.settings import MAX_BODY_BYTES
from producers.contract import ContextEvent
from producers.corrections import FactCorrections
from producers.errors import PublishError
from store.errors import DatabaseUnavailable, VectorIndexUnavailable

API_VERSION = "1.0.0"


# Every route: no token, a dependency away; a body too large or unparsable, before any route.
_UNAUTHORIZED: dict[int | str, dict[str, Any]] = {401: {"model": Problem}, 503: {"model": Problem}}
_NOT_FOUND: dict[int | str, dict[str, Any]] = {**_UNAUTHORIZED, 404: {"model": Problem}}
_WITH_BODY: dict[int | str, dict[str, Any]] = {400: {"model": Problem}, 413: {"model": Problem}}
# An erasure's memory held by a flush past `API__ERASURE_LOCK_WAIT_S`.
_STARTED: dict[int | str, dict[str, Any]] = {
    202: {
        "model": ErasureOut,
        "description": "the memory is being consolidated: the erasure is audited and memoryd"
        ' finishes it (`status` "started"); the same request again answers its receipt (200)'
        " once it is completed",
    }
}


def _known(deps: ApiDependencies, key: MemoryKey) -> None:
    """404 for a user the token's organization has no memory of."""
    if not deps.reads.known(key):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"unknown user {excerpt(key.user_id)}")


def _turn(deps: ApiDependencies, org: str, body: ContextRequest) -> ContextResponse:
    key = MemoryKey(org, body.user_id)
    log_id = None if body.turn_id is None else turn_log_id_for(key, body.turn_id, body.turn())
    bundle = deps.context.assemble(
        key,
        body.query,
        body.active_connection_ids,
        body.budget,
        context_types=body.context_types,
        log_id=log_id,
    )
    return ContextResponse.of(bundle)


def create_app(
    deps: ApiDependencies | None,
    registry: CollectorRegistry | None = None,
    on_shutdown: Sequence[Callable[[], None]] = (),
    health: HealthMonitor | None = None,
    turn_threads: int = 2,
    max_body_bytes: int = MAX_BODY_BYTES,
    erasure_threads: int = 2,
) -> FastAPI:
    """The application; `deps` may be None only to render the OpenAPI document.

    Chat turns' reads run on at most `turn_threads` threads, erasures on at most
    `erasure_threads`; the other routes on the server's shared thread pool. An erasure waits
    for its memory's lock while a flush holds it (through the flush's model calls), up to its
    eraser's `lock_wait_s`, then is audited and answered 202, left for the processors to
    finish: on the shared pool, a burst of erasures would hold every thread, and every other
    tenant's requests would wait for them.

    `on_shutdown` runs, in order, in the server's graceful shutdown: uvicorn re-raises SIGTERM
    once it has stopped, so code after `uvicorn.run` never runs and cannot be where the audit
    rows and recall counters still queued get written, nor the Kafka publisher closed.
    """

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        if deps is not None and deps.queries is not None:
            deps.queries.close()
        for step in on_shutdown:
            await run_in_threadpool(step)

    app = FastAPI(
        lifespan=lifespan,
        title="memoryd",
        version=API_VERSION,
        description="Memory for AI agents: the context of a chat turn, what is remembered "
        "about a user, and the user's corrections. Every route needs a bearer token issued "
        "to an organization and acts only on that organization's users.",
    )
    app.state.deps = deps

    @app.exception_handler(RequestValidationError)
    def _invalid(_request: Request, e: RequestValidationError) -> JSONResponse:
        # FastAPI's own answer echoes each invalid input whole; this one names where and what.
        return JSONResponse({"detail": validation_problems(e.errors())}, status_code=422)

    @app.exception_handler(DatabaseUnavailable)
    def _database_down(_request: Request, e: DatabaseUnavailable) -> JSONResponse:
        return _database_unavailable(e)

    @app.exception_handler(PublishError)
    def _kafka_down(_request: Request, e: PublishError) -> JSONResponse:
        return JSONResponse({"detail": f"events not accepted: {e}"}, status_code=503)

    for index_away in (VectorIndexUnavailable, ErasureIncomplete):
        # The erasures need Chroma (a turn does without it, on its keyword side); one that
        # fails there stays open, and the same request again finishes it.
        app.add_exception_handler(index_away, _vector_index_unavailable)

    add_health_routes(app, health)

    # A turn's read holds the GIL for most of its time. Two threads overlap one turn's wait
    # for Postgres with another's Python; more only take turns at the GIL in no fixed order,
    # which stretched the tail (see BENCHMARKS.md, API under load). Turns beyond them wait
    # in arrival order on the event loop, holding no thread.
    turns = CapacityLimiter(turn_threads)

    async def serve_turn(org: str, body: ContextRequest) -> ContextResponse:
        assert deps is not None  # no route runs in the app made only for its OpenAPI document
        if deps.queries is not None:
            await deps.queries.embed(body.query)
        return await to_thread.run_sync(partial(_turn, deps, org, body), limiter=turns)

    @app.post("/v1/context", tags=["read"], responses={**_UNAUTHORIZED, **_WITH_BODY})
    async def read_context(body: ContextRequest, org: Organization) -> ContextResponse:
        """The context of one chat turn: the rendered prompt block and what went into it."""
        return await serve_turn(org, body)

    if deps is not None:
        app.add_middleware(
            TurnLane,
            serve=serve_turn,
            tokens=deps.tokens,
            route=_route(app, "/v1/context"),
            database_down=_database_unavailable,
        )
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)  # added last: around the lane

    @app.get(
        "/v1/users/{user_id}/memory",
        tags=["inspect"],
        responses=_NOT_FOUND,
    )
    def inspect_memory(
        user_id: UserId,
        deps: Deps,
        org: Organization,
        fact_status: Annotated[list[FactStatus] | None, Query(alias="status")] = None,
        limit: PageSize = DEFAULT_PAGE,
        cursor: Cursor = None,
    ) -> MemoryResponse:
        """What memoryd remembers about a user: W, S, learned info and facts with their
        status and provenance (every status unless `status` is given). Facts come a page at
        a time, in the order they were learned: up to `limit`, and `next_cursor` to ask for
        the next page with (null on the last); W, S and learned info come with every page."""
        key = MemoryKey(org, user_id)
        _known(deps, key)
        injection = deps.reads.injection(key)
        after = None if cursor is None else position(cursor)
        statuses = fact_status or tuple(FactStatus)
        facts = deps.reads.user_facts(key, statuses, after=after, limit=limit + 1)
        page = facts[:limit]
        state = injection.state if injection is not None else None
        return MemoryResponse(
            user_id=user_id,
            organization_id=org,
            memory_version=state.version if state else 0,
            working_memory=state.working_memory if state else "",
            scaffold=dict(state.scaffold) if state else {},
            learned_info=list(state.learned_info) if state else [],
            connection_info={k: list(v) for k, v in injection.connections.items()}
            if injection
            else {},
            facts=[FactOut.of(f) for f in page],
            next_cursor=cursor_of(page[-1]) if len(facts) > limit else None,
        )

    @app.post(
        "/v1/users/{user_id}/facts/{fact_id}/correction",
        status_code=status.HTTP_202_ACCEPTED,
        tags=["correct"],
        responses={**_NOT_FOUND, **_WITH_BODY},
    )
    def correct_fact(
        user_id: UserId,
        fact_id: uuid.UUID,
        body: CorrectionRequest,
        deps: Deps,
        org: Organization,
    ) -> Accepted:
        """Replace a fact with what is true: the fact is contradicted, the content becomes a
        correction observation, once the pipeline has run."""
        fact = _own_fact(deps, MemoryKey(org, user_id), fact_id)
        events = FactCorrections(deps.publisher, user_id, org).correct_fact(
            fact_id,
            body.content,
            connection_id=fact.provenance.connection_id,
            # Without the caller's key the request names its events: the same correction of
            # the same version of the fact, sent again after a 503 that hid a success, is one.
            idempotency_key=_scoped(
                org, user_id, body.idempotency_key or _implicit_key(fact, body.content)
            ),
        )
        return Accepted(event_ids=[e.event_id for e in events])

    _add_erasure_routes(app, CapacityLimiter(erasure_threads))

    @app.post(
        "/v1/events",
        status_code=status.HTTP_202_ACCEPTED,
        tags=["write"],
        response_model=Accepted,
        responses={**_UNAUTHORIZED, **_WITH_BODY, **NOT_ALL_ACCEPTED, 403: {"model": Problem}},
    )
    def publish_events(body: EventsRequest, deps: Deps, org: Organization) -> Any:
        """Publish observations (the `ContextEvent` contract) into the pipeline: 202 once Kafka
        acknowledged every event. Not all or none: otherwise the answer names the events
        acknowledged and those not (see `EventsNotAccepted`)."""
        _publishable(org, body.events)
        try:
            deps.publisher.publish(body.events)
        except PublishError as e:
            return not_accepted_answer(body.events, e)
        return Accepted(event_ids=[e.event_id for e in body.events])

    # Added last, so it is the outermost of the application's middleware: it times the turns
    # the lane answers too.
    if registry is not None:
        app.add_middleware(RequestLatencyMiddleware, metrics=HttpMetrics(registry))
    return app


def _add_erasure_routes(app: FastAPI, erasures: CapacityLimiter) -> None:
    """The DELETE routes, run on the `erasures` threads only."""

    @app.delete(
        "/v1/users/{user_id}/facts/{fact_id}",
        tags=["erase"],
        responses={**_NOT_FOUND, **_STARTED},
    )
    async def delete_fact(
        user_id: UserId,
        fact_id: uuid.UUID,
        deps: Deps,
        org: Organization,
        response: Response,
        idempotency_key: IdempotencyKey = None,
        reason: Reason = "deleted through the API",
    ) -> ErasureOut:
        """Delete a fact for real: its row, history and vector, and its text wherever the
        memory kept a copy (runs, W, S, the observations it came from). Not an archive."""
        request = ErasureRequest(f"api:{org}", reason, idempotency_key)
        erase = partial(_erase_fact, deps, MemoryKey(org, user_id), fact_id, request)
        return _answered(await to_thread.run_sync(erase, limiter=erasures), user_id, response)

    @app.delete("/v1/users/{user_id}", tags=["erase"], responses={**_UNAUTHORIZED, **_STARTED})
    async def forget_user(
        user_id: UserId,
        deps: Deps,
        org: Organization,
        response: Response,
        idempotency_key: IdempotencyKey = None,
        reason: Reason = "erasure request",
    ) -> ErasureOut:
        """Forget the organization's user everywhere: event log, runs, facts, memory,
        connections, audit rows, vectors, and (through a tombstone on Kafka) every consumer's
        buffers and any later replay. The ledger keeps its amounts under a pseudonym."""
        request = ErasureRequest(f"api:{org}", reason, idempotency_key)
        forget = partial(deps.eraser.forget_or_accept, MemoryKey(org, user_id), request)
        return _answered(await to_thread.run_sync(forget, limiter=erasures), user_id, response)


def _answered(outcome: Outcome, user_id: str, response: Response) -> ErasureOut:
    out = ErasureOut.of(outcome, user_id)
    if out.status == "started":
        response.status_code = status.HTTP_202_ACCEPTED
    return out


def _database_unavailable(e: DatabaseUnavailable) -> JSONResponse:
    return JSONResponse({"detail": f"database unavailable: {e}"}, status_code=503)


def _vector_index_unavailable(_request: Request, e: Exception) -> JSONResponse:
    return JSONResponse({"detail": f"vector index unavailable: {e}"}, status_code=503)


def _route(app: FastAPI, path: str) -> APIRoute:
    return next(r for r in app.routes if isinstance(r, APIRoute) and r.path == path)


def _own_fact(deps: ApiDependencies, key: MemoryKey, fact_id: uuid.UUID) -> Fact:
    _known(deps, key)
    fact = deps.reads.user_fact(key, fact_id)
    if fact is None:
        raise _no_such_fact(key, fact_id)
    return fact


def _erase_fact(
    deps: ApiDependencies, key: MemoryKey, fact_id: uuid.UUID, request: ErasureRequest
) -> Outcome:
    if request.request_id is not None:
        # A retried request: the fact is gone, its erasure's receipt is the answer.
        earlier = deps.eraser.earlier_receipt(key, fact_id, request.request_id)
        if earlier is not None:
            return earlier
    _known(deps, key)
    try:
        # A retry of an erasure a crash left midway finishes it (its fact may be gone).
        return deps.eraser.erase_fact_or_accept(key, fact_id, request)
    except UnknownFact as e:
        raise _no_such_fact(key, fact_id) from e


def _implicit_key(fact: Fact, content: str) -> str:
    digest = hashlib.sha256(f"{fact.fact_id}\x1f{fact.version}\x1f{content}".encode())
    return f"implicit:{digest.hexdigest()}"


def _no_such_fact(key: MemoryKey, fact_id: uuid.UUID) -> HTTPException:
    return HTTPException(
        status.HTTP_404_NOT_FOUND, f"user {excerpt(key.user_id)} has no fact {fact_id}"
    )


def _scoped(org: str, user_id: str, key: str | None) -> str | None:
    # Keys from different tenants must never collide into one event id.
    return None if key is None else f"{org}\x1f{user_id}\x1f{key}"


def _publishable(org: str, events: Sequence[ContextEvent]) -> None:
    """A token publishes into its own organization only; whose user ids they are needs no
    check, since (organization, user) is the memory an event reaches."""
    for event in events:
        if event.organization_id != org:
            raise HTTPException(
                status.HTTP_403_FORBIDDEN, f"event {event.event_id} is for another organization"
            )
