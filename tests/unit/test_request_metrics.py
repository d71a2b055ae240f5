"""The API's latency histogram keeps its label values few whatever a client sends."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import CollectorRegistry

from memoryd.api.metrics import HttpMetrics, RequestLatencyMiddleware


async def not_found(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 404, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def methods_counted(*methods: str) -> dict[str, float]:
    registry = CollectorRegistry()
    app = RequestLatencyMiddleware(not_found, HttpMetrics(registry))

    async def send(message: Any) -> None:
        pass

    async def receive() -> Any:
        return {"type": "http.request", "body": b"", "more_body": False}

    for method in methods:
        scope = {"type": "http", "method": method, "path": "/x"}
        asyncio.run(app(scope, receive, send))
    samples = registry.get_sample_value
    return {
        m: samples(
            "memoryd_http_request_seconds_count",
            {"method": m, "route": "unmatched", "status": "4xx"},
        )
        or 0.0
        for m in ("GET", "POST", "OTHER", "FROB", "XYZZY")
    }


def test_a_method_outside_http_s_own_is_counted_as_other() -> None:
    counted = methods_counted("GET", "FROB", "XYZZY", "POST", "FROB")
    assert counted == {"GET": 1.0, "POST": 1.0, "OTHER": 3.0, "FROB": 0.0, "XYZZY": 0.0}
