"""The API's public /readyz names each dependency, ok or failing, and never a check's error
text: that goes to the log and to the operations port, where only operators look."""

from __future__ import annotations

import logging

import psycopg
import pytest
from fastapi.testclient import TestClient

from memoryd.api.app import create_app
from memoryd.ops.config import OpsSettings
from memoryd.ops.health import Check, HealthMonitor, Role

FAST = OpsSettings(health_interval_s=60, health_timeout_s=1.0)
# What libpq says when the DSN's user is refused: host, address, port and user name.
REFUSED = (
    'connection to server at "pg-primary.internal" (10.20.30.40), port 5432 failed:'
    ' FATAL:  password authentication failed for user "svc_memoryd_rw"'
)
SECRETS = ("pg-primary.internal", "10.20.30.40", "svc_memoryd_rw", "5432", "password")


def postgres_refuses() -> None:
    raise psycopg.OperationalError(REFUSED)


def chroma_answers() -> None:
    return None


def test_a_failing_dependency_is_named_but_its_error_is_only_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    monitor = HealthMonitor(
        [Check("postgres", postgres_refuses), Check("chroma", chroma_answers, Role.DEGRADES)], FAST
    )
    with caplog.at_level(logging.WARNING, logger="memoryd.ops.health"):
        monitor.refresh()
    with TestClient(create_app(None, health=monitor)) as client:
        response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json() == {
        "status": "unready",
        "checks": {"chroma": "ok", "postgres": "failing"},
    }
    assert not [s for s in SECRETS if s in response.text]
    assert REFUSED in caplog.text
    # The operations port keeps the detail.
    assert REFUSED in str(monitor.readiness().to_json())


def test_a_failure_is_logged_once_until_it_changes(caplog: pytest.LogCaptureFixture) -> None:
    monitor = HealthMonitor([Check("postgres", postgres_refuses)], FAST)
    with caplog.at_level(logging.INFO, logger="memoryd.ops.health"):
        monitor.refresh()
        monitor.refresh()
    assert caplog.text.count(REFUSED) == 1
