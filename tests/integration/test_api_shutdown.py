"""`memoryd api` stopped by a signal closes its Kafka publisher once. After its graceful stop,
uvicorn raises SIGTERM again and the process ends by it: nothing after the server runs, so
the close has to be part of that stop. On SIGINT the server's stop and the caller both close
it, and the second close does nothing."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from memoryd.dev import free_port
from tests.support.deployment import Deployment
from tests.support.faults import fault_settings, process_env
from tests.support.ops import get, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CLOSED = "Kafka producer closed with no record unacknowledged"


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_api_closes_its_kafka_publisher_once_when_stopped(
    deployment: Deployment, tmp_path: Path, stop: signal.Signals
) -> None:
    settings = fault_settings(deployment)
    port = free_port()
    # One worker: the process signalled is the server itself (a worker of several is stopped
    # by its parent with SIGTERM, the same stop).
    api_settings = settings.api.model_copy(update={"port": port, "workers": 1})
    settings = settings.model_copy(update={"api": api_settings})
    log_path = tmp_path / "api.log"
    with log_path.open("wb") as log:
        api = subprocess.Popen(
            [sys.executable, "-m", "memoryd.cli", "api"],
            env=process_env(settings),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for("the API answers", lambda: get(f"http://127.0.0.1:{port}/healthz")[0] == 200)
        api.send_signal(stop)
        api.wait(timeout=60)
    finally:
        if api.poll() is None:
            api.kill()
            api.wait(timeout=30)
    text = log_path.read_text(errors="replace")
    assert text.count(CLOSED) == 1, text[-3000:]
