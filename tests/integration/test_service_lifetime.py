"""A service started for a test run stops when the run dies, however it dies (a CI job killed on
its time limit runs no teardown); one started by `memoryd dev up` outlives the command that
started it. And a run ended by SIGTERM tears its fixtures down, as Ctrl-C does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from memoryd.dev import LocalChroma
from memoryd.dev._process import pid_alive, read_pid, wait_until
from memoryd.dev.chroma import heartbeat

pytestmark = pytest.mark.integration
REPO_ROOT = Path(__file__).resolve().parents[2]

# Chroma: the quickest of the three services to start.
STARTS_TWO = """
import sys
from pathlib import Path
from memoryd.dev import LocalChroma, free_port
from tests.support.services import start
home = Path(sys.argv[1])
start(lambda: LocalChroma(home / "tests", free_port(), stop_on_exit=True), 60.0)
print(start(lambda: LocalChroma(home / "dev-up", free_port()), 60.0).url, flush=True)
sys.stdin.read()
"""

WAITS_FOR_SIGTERM = """
import os
import time
from pathlib import Path
import pytest

@pytest.fixture(scope="session")
def service():
    yield
    Path(os.environ["TORN_DOWN"]).touch()

def test_runs_until_stopped(service):
    Path(os.environ["RUNNING"]).touch()
    time.sleep(120)
"""


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), **extra}


def test_a_killed_run_stops_its_services_and_leaves_dev_up_ones(tmp_path: Path) -> None:
    with (tmp_path / "child.log").open("wb") as log:
        child = subprocess.Popen(
            [sys.executable, "-c", STARTS_TWO, str(tmp_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=_env(),
        )
    dev_up = LocalChroma(tmp_path / "dev-up", 0)  # stop() finds the server by its pid file
    try:
        assert child.stdout is not None
        dev_up_url = child.stdout.readline().decode().strip()
        assert dev_up_url, (tmp_path / "child.log").read_text()
        tests_pid = read_pid(tmp_path / "tests" / "chroma.pid")
        assert tests_pid is not None
        assert pid_alive(tests_pid)

        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)

        assert wait_until(lambda: not pid_alive(tests_pid), 10.0), "the test run's Chroma lives"
        assert dev_up.is_running()
        assert heartbeat(dev_up_url)
    finally:
        child.kill()
        child.wait(timeout=30)
        assert child.stdout is not None
        child.stdout.close()
        assert child.stdin is not None
        child.stdin.close()
        dev_up.stop()
        LocalChroma(tmp_path / "tests", 0).stop()  # if the watchdog did not


def test_a_run_ended_by_sigterm_tears_its_fixtures_down(tmp_path: Path) -> None:
    (tmp_path / "test_waits.py").write_text(WAITS_FOR_SIGTERM, encoding="utf-8")
    (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    running, torn_down = tmp_path / "running", tmp_path / "torn-down"
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider"]
    with (tmp_path / "pytest.log").open("wb") as log:
        run = subprocess.Popen(
            [*argv, "test_waits.py"],
            cwd=tmp_path,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_env(RUNNING=str(running), TORN_DOWN=str(torn_down)),
        )
    try:
        assert wait_until(running.exists, 60.0), (tmp_path / "pytest.log").read_text()
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=60)
        assert torn_down.exists(), (tmp_path / "pytest.log").read_text()
    finally:
        run.kill()
        run.wait(timeout=30)
