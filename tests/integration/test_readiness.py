"""/readyz of every process fails while Postgres is down, and recovers when it is back.

The log writer and the processor run for real in threads and answer on their metrics ports;
the API's monitor serves both the API's own /readyz and its metrics port. Postgres is a
server of this test's own, so it can be stopped without disturbing the other tests.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from memoryd import wiring
from memoryd.dev import LocalPostgres, free_port
from memoryd.ops.runtime import dependency_checks, kafka_admin, ops_port
from store.migrate import migrate
from store.postgres import make_pool
from tests.support.deployment import deployment_settings
from tests.support.ops import (
    get,
    log_writer_process,
    processor_process,
    scrape,
    total,
    wait_for,
    with_ops_ports,
)
from tests.support.services import started

pytestmark = pytest.mark.integration


@pytest.fixture
def own_postgres(postgres_home: Path) -> Iterator[LocalPostgres]:
    with started(
        lambda: LocalPostgres(postgres_home, free_port(), for_tests=True, stop_on_exit=True), 60.0
    ) as postgres:
        pool = make_pool(postgres.dsn, max_size=2)
        try:
            migrate(pool)
        finally:
            pool.close()
        yield postgres


def test_readyz_follows_postgres_for_every_process(
    own_postgres: LocalPostgres,
    kafka_bootstrap: str,
    kafka_topic_factory: Callable[..., str],
    tmp_path: Path,
) -> None:
    ports = (free_port(), free_port(), free_port())
    settings = with_ops_ports(
        deployment_settings(
            kafka_bootstrap,
            own_postgres.dsn,
            kafka_topic_factory(partitions=3, prefix="events"),
            kafka_topic_factory(partitions=3, prefix="dlq"),
            tmp_path / "chroma",
        ),
        ports,
    )
    with (
        log_writer_process(settings),
        processor_process(settings),
        wiring.core(settings) as api_core,
    ):
        admin = kafka_admin(settings)
        checks = dependency_checks(api_core, admin, chroma=True)
        with (
            ops_port(api_core, ports[2], checks) as monitor,
            wiring.api_app(api_core, monitor) as app,
            TestClient(app) as api,
        ):

            def answers() -> dict[str, tuple[int, dict[str, object]]]:
                out = {}
                for name, port in zip(
                    ("log_writer", "processor", "api_metrics"), ports, strict=True
                ):
                    status, body = get(f"http://127.0.0.1:{port}/readyz")
                    out[name] = (status, json.loads(body))
                response = api.get("/readyz")
                out["api"] = (response.status_code, response.json())
                return out

            seen: list[object] = []

            def all_ready() -> bool:
                now = answers()
                seen[:] = [now]
                return all(status == 200 for status, _ in now.values())

            try:
                wait_for("every process ready", all_ready, timeout_s=120)
            except AssertionError as e:
                raise AssertionError(f"{e}: {seen}") from None
            assert all(get(f"http://127.0.0.1:{p}/healthz")[0] == 200 for p in ports[:2])
            # Every process exports the standard process and interpreter families too.
            for port in ports:
                exported = scrape(port)
                assert (total(exported, "process_resident_memory_bytes") or 0) > 0, port
                assert total(exported, "python_gc_collections_total") is not None, port

            own_postgres.stop()

            def all_unready() -> dict[str, tuple[int, dict[str, object]]] | None:
                now = answers()
                return now if all(status == 503 for status, _ in now.values()) else None

            down = wait_for("every process unready", all_unready, timeout_s=60)
            _, public = down.pop("api")
            # The API's own port names the dependency only; the operations ports say why.
            assert public == {"status": "unready", "checks": public["checks"]}
            assert isinstance(public["checks"], dict)
            assert public["checks"]["postgres"] == "failing"
            for name, (_, body) in down.items():
                checks_ = body["checks"]
                assert isinstance(checks_, dict)
                assert checks_["postgres"]["up"] is False, name
                assert "postgres down" in str(body["reason"]), name
            # Alive all the same: restarting them would not bring Postgres back.
            assert all(get(f"http://127.0.0.1:{p}/healthz")[0] == 200 for p in ports[:2])
            assert api.get("/healthz").status_code == 200

            own_postgres.start()
            wait_for("every process ready again", all_ready, timeout_s=120)
        admin.close()
