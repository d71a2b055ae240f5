"""The erasure routes (`DELETE /v1/users/{id}`, `DELETE /v1/users/{id}/facts/{fact_id}`), run
on threads of their own: an erasure waits for its memory's lock while a flush holds it, up to
`API__ERASURE_LOCK_WAIT_S`, then is audited and answered 202 for the processors to finish."""

from __future__ import annotations

import uuid
from functools import partial
from typing import Any

from anyio import CapacityLimiter, to_thread
from fastapi import FastAPI, Response, status

from domain.erasure import ErasureOutcome
from domain.ids import MemoryKey
from memoryd.api.dependencies import (
    NOT_FOUND,
    UNAUTHORIZED,
    ApiDependencies,
    Deps,
    IdempotencyKey,
    Organization,
    Reason,
    UserId,
    known,
    no_such_fact,
)
from memoryd.api.models import ErasureOut
from memoryd.erasure import ErasureRequest
from memoryd.erasure_errors import UnknownFact

# An erasure's memory held by a flush past `API__ERASURE_LOCK_WAIT_S`.
_STARTED: dict[int | str, dict[str, Any]] = {
    202: {
        "model": ErasureOut,
        "description": "the memory is being consolidated: the erasure is audited and memoryd"
        ' finishes it (`status` "started"), nothing of it done yet (reads still show the'
        " memory); the same request again with the same `idempotency_key` answers 202 while"
        " it is open, its receipt (200) once it is completed",
    }
}


def add_erasure_routes(app: FastAPI, erasures: CapacityLimiter) -> None:
    """The DELETE routes, run on the `erasures` threads only."""

    @app.delete(
        "/v1/users/{user_id}/facts/{fact_id}",
        tags=["erase"],
        responses={**NOT_FOUND, **_STARTED},
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

    @app.delete("/v1/users/{user_id}", tags=["erase"], responses={**UNAUTHORIZED, **_STARTED})
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


def _answered(outcome: ErasureOutcome, user_id: str, response: Response) -> ErasureOut:
    out = ErasureOut.of(outcome, user_id)
    if out.status == "started":
        response.status_code = status.HTTP_202_ACCEPTED
    return out


def _erase_fact(
    deps: ApiDependencies, key: MemoryKey, fact_id: uuid.UUID, request: ErasureRequest
) -> ErasureOutcome:
    if request.request_id is not None:
        # A retried request: the fact is gone, its erasure's receipt is the answer.
        earlier = deps.eraser.earlier_receipt(key, fact_id, request.request_id)
        if earlier is not None:
            return earlier
    known(deps, key)
    try:
        # A retry of an erasure a crash left midway finishes it (its fact may be gone).
        return deps.eraser.erase_fact_or_accept(key, fact_id, request)
    except UnknownFact as e:
        raise no_such_fact(key, fact_id) from e
