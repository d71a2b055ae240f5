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
from contextlib import ExitStack, asynccontextmanager
from functools import partial
from typing import Annotated, Any

from anyio import CapacityLimiter, to_thread
from fastapi import FastAPI, HTTPException, Query, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from prometheus_client import CollectorRegistry
from starlette.concurrency import run_in_threadpool

from domain.ids import MemoryKey, turn_log_id_for
from domain.model import Fact, FactStatus
from memoryd.api.body_limit import BodyLimit
from memoryd.api.dependencies import (
    NOT_FOUND,
    UNAUTHORIZED,
    ApiDependencies,
    Deps,
    Organization,
    UserId,
    known,
    no_such_fact,
)
from memoryd.api.erasure_routes import add_erasure_routes
from memoryd.api.errors import validation_problems
from memoryd.api.event_batches import NOT_ALL_ACCEPTED, not_accepted_answer
from memoryd.api.health import add_health_routes
from memoryd.api.metrics import HttpMetrics, RequestLatencyMiddleware
from memoryd.api.models import (
    Accepted,
    ContextRequest,
    ContextResponse,
    CorrectionRequest,
    EventsRequest,
    FactOut,
    MemoryResponse,
    Problem,
)
from memoryd.api.pages import DEFAULT_PAGE, Cursor, PageSize, cursor_of, position
from memoryd.api.turn_lane import TurnLane
from memoryd.erasure_errors import ErasureIncomplete
from memoryd.ops.health import HealthMonitor
from memoryd.settings import MAX_BODY_BYTES
from producers.contract import ContextEvent
from producers.corrections import FactCorrections
from producers.errors import PublishError
from store.errors import DatabaseUnavailable, VectorIndexUnavailable

API_VERSION = "1.0.0"


_WITH_BODY: dict[int | str, dict[str, Any]] = {400: {"model": Problem}, 413: {"model": Problem}}


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
        await run_in_threadpool(_in_turn, on_shutdown)

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

    @app.post("/v1/context", tags=["read"], responses={**UNAUTHORIZED, **_WITH_BODY})
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
        responses=NOT_FOUND,
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
        known(deps, key)
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
        responses={**NOT_FOUND, **_WITH_BODY},
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

    add_erasure_routes(app, CapacityLimiter(erasure_threads))

    @app.post(
        "/v1/events",
        status_code=status.HTTP_202_ACCEPTED,
        tags=["write"],
        response_model=Accepted,
        responses={**UNAUTHORIZED, **_WITH_BODY, **NOT_ALL_ACCEPTED, 403: {"model": Problem}},
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


def _in_turn(steps: Sequence[Callable[[], None]]) -> None:
    """Run each step in order, every one even if one before it raised (then raised after)."""
    with ExitStack() as stack:
        for step in reversed(steps):
            stack.callback(step)


def _database_unavailable(e: DatabaseUnavailable) -> JSONResponse:
    return JSONResponse({"detail": f"database unavailable: {e}"}, status_code=503)


def _vector_index_unavailable(_request: Request, e: Exception) -> JSONResponse:
    return JSONResponse({"detail": f"vector index unavailable: {e}"}, status_code=503)


def _route(app: FastAPI, path: str) -> APIRoute:
    return next(r for r in app.routes if isinstance(r, APIRoute) and r.path == path)


def _own_fact(deps: ApiDependencies, key: MemoryKey, fact_id: uuid.UUID) -> Fact:
    known(deps, key)
    fact = deps.reads.user_fact(key, fact_id)
    if fact is None:
        raise no_such_fact(key, fact_id)
    return fact


def _implicit_key(fact: Fact, content: str) -> str:
    digest = hashlib.sha256(f"{fact.fact_id}\x1f{fact.version}\x1f{content}".encode())
    return f"implicit:{digest.hexdigest()}"


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
