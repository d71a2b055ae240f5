"""Request latency of the API as a Prometheus histogram, labelled by route template.

Labels stay low-cardinality: method, the route's path template (never the raw path, which
holds user and fact ids) and the status class.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# A client may send any token as the method (h11 passes it through): one outside these is
# "OTHER", or each invented one would add a histogram's series for every route.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"})


class HttpMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.request_seconds = Histogram(
            "memoryd_http_request_seconds",
            "API request latency",
            ["method", "route", "status"],
            buckets=HTTP_BUCKETS,
            registry=registry,
        )


class RequestLatencyMiddleware:
    """A pure ASGI middleware: it sees the route the router matched in the shared scope."""

    def __init__(self, app: ASGIApp, metrics: HttpMetrics) -> None:
        self._app = app
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self._app(scope, receive, send_status)
        finally:
            route: Any = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = scope["method"] if scope["method"] in METHODS else "OTHER"
            self._metrics.request_seconds.labels(method, template, f"{status // 100}xx").observe(
                time.perf_counter() - started
            )
