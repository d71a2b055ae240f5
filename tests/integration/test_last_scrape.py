"""Rows the read path gives up are counted as the process stops: the metrics port stays open
for one more scrape, or the count (and MemorydReadAuditDropped) would go with the process."""

from __future__ import annotations

import threading
import time

import pytest

from memoryd import wiring
from memoryd.dev import free_port
from memoryd.ops.runtime import ops_port
from memoryd.settings import MetricsSettings
from store.read.read_metrics import ReadPathMetrics
from tests.support.deployment import Deployment
from tests.support.ops import scrape, total, wait_for

pytestmark = pytest.mark.integration
FINAL_SCRAPE_S = 3.0


@pytest.mark.parametrize("dropped", [2, 0])
def test_rows_given_up_at_the_end_are_scraped_before_the_port_closes(
    deployment: Deployment, dropped: int
) -> None:
    port = free_port()
    deployment.settings = deployment.settings.model_copy(
        update={"metrics": MetricsSettings(enabled=True, final_scrape_s=FINAL_SCRAPE_S)}
    )
    work_ended = threading.Event()

    def process(c: wiring.Core) -> float:
        metrics = ReadPathMetrics(c.registry)
        with ops_port(c, port, []):
            metrics.dropped("context-log", "shutdown", dropped)  # as its writer closes
            work_ended.set()
        return time.monotonic()

    ended: list[float] = []
    runner = threading.Thread(target=lambda: ended.append(deployment.with_core(process)))
    runner.start()
    work_ended.wait(timeout=60)
    stopped_at = time.monotonic()
    if dropped:
        samples = wait_for("the last scrape", lambda: scrape(port), timeout_s=FINAL_SCRAPE_S)
        counted = total(samples, "memoryd_background_dropped_total", reason="shutdown")
        assert counted == dropped
    runner.join(timeout=60)
    lingered = ended[0] - stopped_at
    assert lingered >= FINAL_SCRAPE_S if dropped else lingered < FINAL_SCRAPE_S
