"""The Prometheus alert rules and their promtool unit tests (infra/prometheus).

promtool comes with Prometheus; infra/bootstrap.sh puts it in the virtualenv. Without it the
promtool tests skip and the structural checks below still run.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]  # PyYAML ships no stubs

from memoryd.settings import ApiSettings, MetricsSettings

REPO_ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = REPO_ROOT / "infra" / "prometheus"
ALERTS = PROMETHEUS / "alerts.yml"
ALERTS_TEST = PROMETHEUS / "alerts_test.yml"
SEVERITIES = frozenset({"critical", "warning", "info"})


def promtool() -> str:
    found = shutil.which("promtool")
    if found:
        return found
    beside = Path(sys.executable).parent / "promtool"  # where infra/bootstrap.sh installs it
    if beside.is_file():
        return str(beside)
    pytest.skip("promtool not installed (infra/bootstrap.sh installs it)")


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [promtool(), *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_promtool_accepts_the_rules() -> None:
    out = run_promtool("check", "rules", str(ALERTS)).stdout
    assert f"SUCCESS: {len(rules())} rules found" in out


def test_promtool_unit_tests_of_the_alerts_pass() -> None:
    out = run_promtool("test", "rules", str(ALERTS_TEST)).stdout
    assert "SUCCESS" in out


def test_the_scrape_config_loads_the_rules_where_compose_mounts_them(tmp_path: Path) -> None:
    config = (PROMETHEUS / "prometheus.yml").read_text()
    mounted = "/etc/prometheus/alerts.yml"  # infra/compose.yaml mounts alerts.yml there
    assert mounted in config
    shutil.copy(ALERTS, tmp_path / "alerts.yml")
    (tmp_path / "prometheus.yml").write_text(config.replace(mounted, str(tmp_path / "alerts.yml")))
    run_promtool("check", "config", str(tmp_path / "prometheus.yml"))


def test_every_alert_has_a_severity_a_summary_and_a_description() -> None:
    for rule in rules():
        assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        assert rule["annotations"]["description"], rule["alert"]
        assert rule["alert"].startswith("Memoryd"), rule["alert"]


def test_every_alert_has_a_unit_test_where_it_fires_and_one_where_it_does_not() -> None:
    doc = yaml.safe_load(ALERTS_TEST.read_text())
    cases = [case for test in doc["tests"] for case in test["alert_rule_test"]]
    fires = {c["alertname"] for c in cases if c.get("exp_alerts")}
    silent = {c["alertname"] for c in cases if not c.get("exp_alerts")}
    names = {rule["alert"] for rule in rules()}
    assert len(names) == len(rules()), "alert names must be unique"
    assert names - fires == set(), "alerts never shown firing in alerts_test.yml"
    assert names - silent == set(), "alerts never shown silent in alerts_test.yml"


def test_every_alert_has_a_runbook_entry_in_the_readme() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    runbook = readme[readme.index("### Runbook") :]
    missing = [
        r["alert"]
        for r in rules()
        if f"| {r['alert']} ({r['labels']['severity']}) |" not in runbook
    ]
    assert not missing, f"add these alerts to the README's runbook: {missing}"


def test_the_scrape_config_has_a_target_for_every_api_worker_of_the_defaults() -> None:
    # The defaults, not the environment's: the config is written for them.
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    (memoryd,) = [job for job in config["scrape_configs"] if job["job_name"] == "memoryd"]
    api = [
        int(target.rsplit(":", 1)[1])
        for group in memoryd["static_configs"]
        if group["labels"]["component"] == "api"
        for target in group["targets"]
    ]
    first = MetricsSettings().api_port
    assert api == list(range(first, first + ApiSettings().workers))
