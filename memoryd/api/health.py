"""/healthz and /readyz of the API, answered from the process's health monitor.

No token: load balancers and orchestrators call them. /readyz names each dependency, ok or
failing, and nothing else: a check's error text (hosts, users, pieces of a DSN) goes to the
log and to the operations port's /readyz, never to this public port.

Both answer on the event loop (they only read the monitor's last verdict): on the server's
thread pool, requests holding every thread of it would fail the probes of a process that
is alive and ready.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from memoryd.ops.health import HealthMonitor

_UNREADY: dict[int | str, dict[str, Any]] = {503: {"description": "a dependency is down"}}


def add_health_routes(app: FastAPI, health: HealthMonitor | None) -> None:
    @app.get("/healthz", tags=["operations"])
    async def healthz() -> dict[str, str]:
        """Live: the process answers (restart it when this fails)."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["operations"], responses=_UNREADY)
    async def readyz() -> JSONResponse:
        """Ready: Postgres and Kafka answer, and no degraded mode (Chroma down) is on."""
        if health is None:
            return JSONResponse({"status": "ready", "checks": {}})
        verdict = health.readiness()
        return JSONResponse(verdict.public_json(), status_code=200 if verdict.ready else 503)
