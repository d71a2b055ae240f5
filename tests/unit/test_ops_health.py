"""Health verdicts, expiring telemetry gauges and the `replay verify` spelling, without services."""

from __future__ import annotations

import threading

import pytest
from prometheus_client import CollectorRegistry

from consumers.batching import TopicPartition
from consumers.liveness import ConsumerLiveness
from memoryd.ops.commands import REPLAY_VERIFY, rewrite_argv
from memoryd.ops.config import OpsSettings
from memoryd.ops.health import Check, HealthMonitor, Role
from memoryd.ops.metrics import ExpiringGauge, HealthMetrics

FAST = OpsSettings(health_interval_s=60, health_timeout_s=0.2)


def down() -> None:
    raise ConnectionError("refused")


def up() -> None:
    return None


@pytest.mark.parametrize(
    ("checks", "unready_when_degraded", "ready", "reason"),
    [
        ([Check("postgres", up), Check("chroma", up, Role.DEGRADES)], True, True, ""),
        ([Check("postgres", down)], True, False, "postgres down"),
        ([Check("postgres", up), Check("chroma", down, Role.DEGRADES)], True, False, "degraded"),
        ([Check("postgres", up), Check("chroma", down, Role.DEGRADES)], False, True, ""),
    ],
)
def test_the_verdict(
    checks: list[Check], unready_when_degraded: bool, ready: bool, reason: str
) -> None:
    settings = FAST.model_copy(update={"unready_when_degraded": unready_when_degraded})
    verdict = HealthMonitor(checks, settings).refresh()
    assert verdict.ready is ready
    assert reason in verdict.reason
    if not ready:
        assert verdict.to_json()["status"] == "unready"


def test_a_hung_check_is_down_and_never_blocks_the_verdict() -> None:
    release = threading.Event()
    monitor = HealthMonitor([Check("kafka", release.wait)], FAST)
    assert monitor.refresh().checks["kafka"].error == "no answer in time"
    # Still hung: the next refresh does not start a second probe behind it.
    assert monitor.refresh().checks["kafka"].error == "the previous check has not returned"
    release.set()


def test_the_consumer_must_have_joined_and_keep_polling() -> None:
    clock = [100.0]
    consumer = ConsumerLiveness(lambda: clock[0])
    registry = CollectorRegistry()
    monitor = HealthMonitor([Check("postgres", up)], FAST, HealthMetrics(registry), consumer)
    assert "not joined" in monitor.refresh().reason
    consumer.assigned([])  # a standby member with no partition is ready too
    consumer.polled()
    assert monitor.refresh().ready
    assert registry.get_sample_value("memoryd_ready") == 1
    assert registry.get_sample_value("memoryd_dependency_up", {"dependency": "postgres"}) == 1
    consumer.left([TopicPartition("t", 0)])
    assert not monitor.refresh().ready
    assert monitor.liveness() == (True, "ok")
    clock[0] += FAST.loop_stale_s + 1
    alive, why = monitor.liveness()
    assert not alive
    assert "has not polled" in why


def test_telemetry_gauges_expire_instead_of_lingering() -> None:
    clock = [0.0]
    gauge = ExpiringGauge("memoryd_x", "x", ["consumer"], expire_s=10, monotonic=lambda: clock[0])
    registry = CollectorRegistry()
    registry.register(gauge)
    assert registry.get_sample_value("memoryd_x", {"consumer": "processor"}) is None
    gauge.publish({("processor",): 7.0})
    assert registry.get_sample_value("memoryd_x", {"consumer": "processor"}) == 7.0
    clock[0] = 11
    assert registry.get_sample_value("memoryd_x", {"consumer": "processor"}) is None


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["replay", "verify", "--all"], [REPLAY_VERIFY, "--all"]),
        (["--config", "m.toml", "replay", "verify"], ["--config", "m.toml", REPLAY_VERIFY]),
        (["replay", "ada", "--json"], ["replay", "ada", "--json"]),
        (["history", "replay", "verify"], ["history", "replay", "verify"]),
    ],
)
def test_replay_verify_is_its_own_command(argv: list[str], expected: list[str]) -> None:
    assert rewrite_argv(argv) == expected
