"""A running processor's metrics port reports freshness and the broker-side consumer lag.

The pipeline runs for real (log writer and processor on Kafka, Postgres, Chroma); the backend
is paused, as when an LLM provider hangs: freshness grows and the processor group's lag holds
the unconsumed events while the log writer's stays at zero. Resumed, both come back to zero.
"""

from __future__ import annotations

from typing import Any

import pytest

from memoryd.dev import free_port
from processors.offline import OfflineBackend
from tests.support.builders import make_event
from tests.support.deployment import Deployment
from tests.support.ops import (
    PausableBackend,
    log_writer_process,
    processor_process,
    scrape,
    total,
    wait_for,
    with_ops_ports,
)

pytestmark = pytest.mark.integration


def test_freshness_and_lag_follow_a_paused_then_resumed_pipeline(deployment: Deployment) -> None:
    ports = (free_port(), free_port(), free_port())
    settings = with_ops_ports(deployment.settings, ports)
    deployment.settings = settings
    backend: dict[str, PausableBackend] = {}

    def pausable(c: Any) -> PausableBackend:
        backend["b"] = PausableBackend(OfflineBackend(c.embedder))
        return backend["b"]

    port = ports[1]
    with log_writer_process(settings), processor_process(settings, pausable):
        deployment.publish([make_event(f"u{i}", f"I like tea number {i}") for i in range(4)])

        def settled() -> bool:
            m = scrape(port)
            return (
                total(m, "memoryd_freshness_seconds") == 0
                and total(m, "memoryd_events_pending") == 0
                and total(m, "memoryd_consumer_lag_records", consumer="processor") == 0
                and total(m, "memoryd_consumer_lag_records", consumer="log-writer") == 0
            )

        wait_for("the first events consolidated", settled, timeout_s=120)

        backend["b"].running.clear()  # the LLM hangs from here on
        paused = [make_event(f"p{i}", f"I moved to city number {i}") for i in range(6)]
        deployment.publish(paused)
        logged = {str(e.event_id) for e in paused}
        wait_for(
            "the paused events logged",
            lambda: (
                len(
                    deployment.query(
                        "SELECT event_id::text FROM context_events WHERE event_id::text = ANY(%s)",
                        (list(logged),),
                    )
                )
                == len(paused)
            ),
        )

        def stalled() -> dict[str, float] | None:
            m = scrape(port)
            lag = total(m, "memoryd_consumer_lag_records", consumer="processor")
            fresh = total(m, "memoryd_freshness_seconds")
            if lag == len(paused) and fresh is not None and fresh > 1.0:
                return {"freshness": fresh, "lag": lag}
            return None

        first = wait_for("freshness and lag to show the stall", stalled)
        second = wait_for(
            "freshness to keep growing",
            lambda: (s := stalled()) is not None and s["freshness"] >= first["freshness"] + 1 and s,
        )
        m = scrape(port)
        assert total(m, "memoryd_events_pending") == len(paused)
        assert total(m, "memoryd_consumer_lag_records", consumer="log-writer") == 0
        # Per partition: the lags add up to what was published, none is negative.
        partitions = {
            dict(labels)["partition"]: v
            for (name, labels), v in m.items()
            if name == "memoryd_consumer_lag_records" and dict(labels)["consumer"] == "processor"
        }
        assert len(partitions) == 3
        assert sum(partitions.values()) == len(paused)
        assert min(partitions.values()) >= 0

        backend["b"].running.set()  # the provider is back
        wait_for("freshness back under target and lag at zero", settled, timeout_s=120)
        m = scrape(port)
        assert (total(m, "memoryd_freshness_seconds") or 0.0) == 0
        assert second["freshness"] > first["freshness"]
