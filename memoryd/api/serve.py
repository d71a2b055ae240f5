"""Serving the API with several worker processes on one listening socket.

A chat turn's read is CPU work in Python (query embedding, ranking, JSON) and one process
runs Python on one core at a time, so one process caps the API at one core whatever its
thread pool. The parent binds the socket and starts `api.workers` processes that each build
their own core (pool, embedder, caches) and take even shares of the connections on the shared
socket (`memoryd.api.balanced_accept`). Each worker serves its metrics on
`metrics.api_port + i`.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import threading
from collections.abc import Sequence
from multiprocessing.process import BaseProcess
from types import FrameType

from memoryd import wiring
from memoryd.api.balanced_accept import SharedListener
from memoryd.ops.logs import configure_logging
from memoryd.ops.runtime import run_api
from memoryd.settings import Settings

log = logging.getLogger(__name__)


def serve(settings: Settings) -> int:
    """Serve until SIGINT or SIGTERM; one worker runs in this process itself. The exit code:
    1 when a worker ended while the service was not stopping (see `_supervise`)."""
    workers = settings.api.workers
    if workers == 1:
        _run_worker(settings, None)
        return 0
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((settings.api.host, settings.api.port))
    sock.set_inheritable(True)
    # One BLAS thread per worker: the workers already use every core, and OpenBLAS's own
    # threads spinning against them made the dense stage's product 3-4 times slower on a busy
    # 2-core machine (10k facts, load average 28: 56-67 ms against 16-21 ms). Each spawned
    # worker's numpy reads it at import; an explicit setting in the environment wins.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    settings = worker_settings(settings)
    # spawn, not fork: each worker starts with no threads and no connections of the parent's.
    context = multiprocessing.get_context("spawn")
    loads = context.Array("i", workers, lock=False)  # each worker's open connections
    children = [
        context.Process(
            target=_run_worker,
            args=(settings, SharedListener(sock, loads, i)),
            name=f"memoryd-api-{i}",
        )
        for i in range(workers)
    ]
    for child in children:
        child.start()
    # Each worker has its own copy now. The parent's would keep the socket listening after
    # the workers close theirs to drain: the kernel would go on queueing connections nobody
    # accepts, hanging until the parent exits, where a closed port refuses them at once.
    sock.close()
    log.info("API on %s:%d with %d worker processes", settings.api.host, settings.api.port, workers)

    stopping = threading.Event()

    def stop(signum: int, _frame: FrameType | None) -> None:
        stopping.set()
        _terminate(children)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    failed = _supervise(children, stopping)
    return 1 if failed else 0


def _supervise(children: Sequence[BaseProcess], stopping: threading.Event) -> bool:
    """Wait for every worker to end; whether one ended on its own. A worker that ends while
    the service is not stopping (it could not start, or it died) stops the others: a service
    left with fewer workers than configured would go on, slower, with nothing but a traceback
    in its log to say so; exiting non-zero hands the restart to the supervisor."""
    running = list(children)
    failed = False
    while running:
        ended = multiprocessing.connection.wait([c.sentinel for c in running])
        for child in [c for c in running if c.sentinel in ended]:
            child.join()
            running.remove(child)
            if not stopping.is_set() and not failed:
                failed = True
                log.error(
                    "API worker %s ended with exit code %s: stopping the other workers",
                    child.name,
                    child.exitcode,
                )
                _terminate(running)
    return failed


def _terminate(children: Sequence[BaseProcess]) -> None:
    for child in children:
        if child.pid is not None and child.is_alive():
            child.terminate()


def worker_settings(settings: Settings) -> Settings:
    """One embedding-model thread per worker unless `embedding_threads` is set, for the same
    reason as OpenBLAS's: bench.api at 16 clients, 187 -> 210 req/s (p99 135 -> 128 ms)
    against onnxruntime's default of one thread per core in each worker."""
    if "embedding_threads" in settings.model_fields_set:
        return settings
    return settings.model_copy(update={"embedding_threads": 1})


def _run_worker(settings: Settings, listener: SharedListener | None) -> None:
    if listener is not None:
        # A spawned worker starts with a fresh interpreter: set its logging up again.
        configure_logging(settings.log_level, settings.log_format)
        _stop_with_the_parent()
    with wiring.core(settings) as c:
        run_api(c, listener=listener)


def _stop_with_the_parent() -> None:
    """SIGTERM this worker when its parent is gone. A parent killed outright (SIGKILL, the OOM
    killer) cannot stop its workers; left alone they would go on accepting on the inherited
    socket, unsupervised, and hold the port against the restarted service."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        log.warning("the API's parent process is gone; this worker stops")
        os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's own graceful shutdown

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
