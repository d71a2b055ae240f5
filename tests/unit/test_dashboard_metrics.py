"""The Grafana dashboard and the alert rules only use metrics that memoryd exports.

The names come from building every process's registry (memoryd/ops/catalog.py: log writer,
processor, API) and expanding each family the way Prometheus sees it: counters as `_total`,
histograms as `_bucket`, `_sum` and `_count`, gauges as they are. A renamed metric then fails
here, not on a blank panel; a metric defined in the code but registered by no process fails
here too.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML ships no stubs
from prometheus_client import CollectorRegistry, Histogram

from memoryd.ops.catalog import COMPONENTS, component_registry

REPO_ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = REPO_ROOT / "infra" / "grafana" / "dashboards" / "memoryd.json"
ALERTS = REPO_ROOT / "infra" / "prometheus" / "alerts.yml"
PROVISIONING = REPO_ROOT / "infra" / "grafana" / "provisioning"
# memoryd's own families, and the standard process and interpreter ones every registry has.
METRIC = re.compile(r"\b(?:memoryd|process|python)_[a-z_]+")
# histogram_quantile(q, ... NAME_bucket ...) > threshold
QUANTILE_ALERT = re.compile(
    r"histogram_quantile\(.*?\b(memoryd_[a-z_]+_bucket)\b.*\)\s*>\s*([0-9.]+)", re.DOTALL
)
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


PACKAGES = ("consumers", "processors", "store", "memoryd")
# A metric's name as its constructor gets it: Counter("memoryd_x", ...), gauge("memoryd_y", ...).
DEFINED = re.compile(r"""\(\s*["'](memoryd_[a-z_]+)["']""")


def exported() -> dict[str, str]:
    """Series name → the family it belongs to, over every process's registry."""
    names: dict[str, str] = {}
    for component in COMPONENTS:
        registry: CollectorRegistry = component_registry(component)
        for family in registry.collect():
            for suffix in SUFFIXES[family.type]:
                names[family.name + suffix] = family.name
    return names


def defined_in_code() -> set[str]:
    found: set[str] = set()
    for package in PACKAGES:
        for path in (REPO_ROOT / package).rglob("*.py"):
            found.update(DEFINED.findall(path.read_text()))
    return found


def test_every_metric_the_code_defines_is_registered_by_some_process() -> None:
    families = set(exported().values())
    # Counters are defined without the _total their series get.
    missing = {m for m in defined_in_code() if m.removesuffix("_total") not in families}
    assert defined_in_code(), "the scan found no metric definitions"
    assert not missing, f"defined but in no registry of memoryd/ops/catalog.py: {sorted(missing)}"


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def panel_expressions() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in panels() for t in p["targets"]]


def alert_expressions() -> list[tuple[str, str]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [(r["alert"], r["expr"]) for g in doc["groups"] for r in g["rules"]]


def test_the_exported_names_follow_prometheus_conventions() -> None:
    names = exported()
    assert "memoryd_records_total" in names
    assert {"memoryd_flush_seconds_bucket", "memoryd_flush_seconds_count"} <= names.keys()
    assert "memoryd_buffered_events" in names
    assert "memoryd_freshness_seconds" in names
    assert "memoryd_consumer_lag_records" in names
    assert "memoryd_http_request_seconds_bucket" in names
    assert "memoryd_context_assemble_seconds_count" in names


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_every_metric_used_is_exported(source: str) -> None:
    expressions = panel_expressions() if source == "dashboard" else alert_expressions()
    assert expressions
    names = exported()
    unknown = {
        (where, metric)
        for where, expr in expressions
        for metric in METRIC.findall(expr)
        if metric not in names
    }
    assert not unknown, f"not exported by any memoryd process: {sorted(unknown)}"


def test_every_exported_metric_has_a_panel() -> None:
    used = {exported().get(m) for _, expr in panel_expressions() for m in METRIC.findall(expr)}
    missing = set(exported().values()) - used
    assert not missing, f"add a panel for {sorted(missing)} to {DASHBOARD.relative_to(REPO_ROOT)}"


def test_panels_use_the_provisioned_datasource_and_fit_the_grid() -> None:
    provisioned = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text())
    uid = provisioned["datasources"][0]["uid"]
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in dashboard()["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        mine = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        cells |= mine
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == uid, panel["title"]
            assert all(t["datasource"]["uid"] == uid for t in panel["targets"])


def test_the_dashboard_provider_reads_where_compose_mounts_the_dashboards() -> None:
    compose = (REPO_ROOT / "infra" / "compose.yaml").read_text()
    provider = yaml.safe_load((PROVISIONING / "dashboards" / "memoryd.yml").read_text())
    path = provider["providers"][0]["options"]["path"]
    assert f"./grafana/dashboards:{path}:ro" in compose
    assert "./grafana/provisioning:/etc/grafana/provisioning:ro" in compose


def bucket_bounds() -> dict[str, set[float]]:
    """Histogram series name (`_bucket`) → its upper bounds, over every process's registry."""
    bounds: dict[str, set[float]] = {}
    for component in COMPONENTS:
        registry = component_registry(component)
        for name, collector in registry._names_to_collectors.items():
            if isinstance(collector, Histogram) and name.endswith("_bucket"):
                bounds[name] = set(collector._upper_bounds)
    return bounds


def test_every_quantile_alert_threshold_is_a_bucket_bound() -> None:
    # Inside a bucket histogram_quantile interpolates: with bounds 0.25 and 0.5 only, whether
    # the p99 is above 0.3 s is guessed from how many requests took 0.25-0.5 s.
    quantiles = [
        (alert, m.group(1), float(m.group(2)))
        for alert, expr in alert_expressions()
        if (m := QUANTILE_ALERT.search(expr))
    ]
    assert len(quantiles) >= 3, "the scan found no quantile alerts"
    bounds = bucket_bounds()
    off = [(a, series, t) for a, series, t in quantiles if t not in bounds[series]]
    assert not off, f"add these thresholds to the histograms' buckets: {off}"


def test_no_panel_plots_the_deleted_audit_rows_twice() -> None:
    # Retention counts them in its own counter and as a maintenance change of rule
    # context_logs_deleted: a panel with both draws each deletion as two lines.
    def counts_deletions(expr: str) -> bool:
        if "memoryd_context_logs_deleted_total" in expr:
            return True
        changes = "memoryd_maintenance_changes_total" in expr
        return changes and not re.search(r'rule!?=|cluster_job="(?!retention)', expr)

    for panel in panels():
        plotting = [t["expr"] for t in panel["targets"] if counts_deletions(t["expr"])]
        assert len(plotting) <= 1, f"{panel['title']}: {plotting}"


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_api_request_series_leave_the_probes_out(source: str) -> None:
    # /healthz and /readyz are polled every few seconds by orchestrators: as routes they
    # would crowd the per-route panels and dilute the error ratio.
    expressions = panel_expressions() if source == "dashboard" else alert_expressions()
    selectors = [
        (where, selector)
        for where, expr in expressions
        for selector in re.findall(r"memoryd_http_request_seconds_[a-z]+(\{[^}]*\})?", expr)
    ]
    assert selectors, "the scan found no API request series"
    with_probes = [(w, s) for w, s in selectors if 'route!~"/healthz|/readyz"' not in s]
    assert not with_probes, f"leave out the probes: {with_probes}"
