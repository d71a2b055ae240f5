"""The operations port of a process: /metrics, /healthz and /readyz.

prometheus_client's own server serves only /metrics; this one serves the same exposition
(through its WSGI app) plus the health endpoints, and can be stopped, which tests need.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from memoryd.ops.health import HealthMonitor

log = logging.getLogger(__name__)
StartResponse = Callable[..., Any]


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes and probes every few seconds are not worth a log line each."""


def _json(start: StartResponse, status: str, body: dict[str, Any]) -> Iterable[bytes]:
    payload = json.dumps(body).encode()
    start(status, [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))])
    return [payload]


def health_app(
    registry: CollectorRegistry, monitor: HealthMonitor
) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            alive, reason = monitor.liveness()
            return _json(
                start,
                "200 OK" if alive else "503 Service Unavailable",
                {
                    "status": "ok" if alive else "stalled",
                    "reason": reason,
                },
            )
        if path == "/readyz":
            verdict = monitor.readiness()
            status = "200 OK" if verdict.ready else "503 Service Unavailable"
            return _json(start, status, verdict.to_json())
        return metrics(environ, start)  # type: ignore[no-any-return]

    return app


class OpsServer:
    def __init__(
        self, host: str, port: int, registry: CollectorRegistry, monitor: HealthMonitor
    ) -> None:
        self._server = make_server(
            host,
            port,
            health_app(registry, monitor),
            server_class=_ThreadingWSGIServer,
            handler_class=_QuietHandler,
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="ops-http", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    def start(self) -> OpsServer:
        self._thread.start()
        log.info("metrics, /healthz and /readyz on port %d", self.port)
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
