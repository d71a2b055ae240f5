"""`memoryd api` with several worker processes: a parent killed outright takes its workers
with it, instead of leaving them to accept on the shared port unsupervised; a worker that
ends on its own takes the service down, instead of leaving it to run short of workers."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memoryd.dev import free_port
from memoryd.settings import Settings
from tests.support.deployment import Deployment
from tests.support.faults import fault_settings, process_env
from tests.support.ops import get, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def children_of(pid: int) -> set[int]:
    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone while we looked
        if int(fields[1]) == pid:
            out.add(int(stat.parent.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def listening_sockets(port: int) -> set[str]:
    """The inodes of the sockets listening on `port` (IPv4)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":  # 0A: LISTEN
            inodes.add(fields[9])
    return inodes


def sockets_of(pid: int) -> set[str]:
    """The inodes of the sockets process `pid` holds open."""
    out = set()
    for fd in (Path("/proc") / str(pid) / "fd").iterdir():
        with contextlib.suppress(OSError):  # closed while we looked
            target = os.readlink(fd)
            if target.startswith("socket:["):
                out.add(target[len("socket:[") : -1])
    return out


def metrics_ports(count: int) -> int:
    """The first of `count` consecutive ports free a moment ago: worker i serves its metrics
    on `metrics.api_port + i` (a lone free port's neighbour was taken once, in CI)."""
    for _ in range(50):
        base = free_port()
        with contextlib.ExitStack() as held:
            try:
                for offset in range(1, count):
                    sock = held.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", base + offset))
            except OSError:
                continue
        return base
    raise AssertionError(f"no {count} consecutive free ports")


def two_workers(deployment: Deployment, metrics_port: int) -> tuple[Settings, int]:
    settings = fault_settings(deployment)
    port = free_port()
    return (
        settings.model_copy(
            update={
                "api": settings.api.model_copy(update={"port": port, "workers": 2}),
                "metrics": settings.metrics.model_copy(update={"api_port": metrics_port}),
            }
        ),
        port,
    )


def test_workers_stop_when_their_parent_is_killed(deployment: Deployment, tmp_path: Path) -> None:
    settings, port = two_workers(deployment, metrics_ports(2))
    with (tmp_path / "api.log").open("wb") as log:
        parent = subprocess.Popen(
            [sys.executable, "-m", "memoryd.cli", "api"],
            env=process_env(settings),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    workers: set[int] = set()
    try:
        wait_for("the API answers", lambda: get(f"http://127.0.0.1:{port}/healthz")[0] == 200)
        # The spawn start method adds a resource tracker beside the two workers.
        workers = {p for p in children_of(parent.pid) if "spawn_main" in _cmdline(p)}
        assert len(workers) == 2, _cmdline(parent.pid)
        # Only the workers hold the listening socket: a copy left open in the parent kept it
        # listening after the workers closed theirs to drain, and the connections the kernel
        # queued meanwhile hung until the parent exited, instead of being refused at once.
        listening = listening_sockets(port)
        assert listening
        assert not listening & sockets_of(parent.pid)
        assert all(listening & sockets_of(w) for w in workers)

        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)

        deadline = time.monotonic() + 60
        while any(alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(alive(w) for w in workers), (tmp_path / "api.log").read_text()[-3000:]
        assert "parent process is gone" in (tmp_path / "api.log").read_text()
    finally:
        for pid in [parent.pid, *workers]:
            if alive(pid):
                subprocess.run(["kill", "-9", str(pid)], check=False)
        parent.wait(timeout=30)


def test_a_worker_that_cannot_start_stops_the_service(
    deployment: Deployment, tmp_path: Path
) -> None:
    metrics_port = metrics_ports(2)
    settings, _ = two_workers(deployment, metrics_port)
    with socket.socket() as taken, (tmp_path / "api.log").open("wb") as log:
        taken.bind(("127.0.0.1", metrics_port + 1))  # the second worker's metrics port
        taken.listen()
        parent = subprocess.Popen(
            [sys.executable, "-m", "memoryd.cli", "api"],
            env=process_env(settings),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            code = parent.wait(timeout=120)
        finally:
            if parent.poll() is None:
                parent.kill()
                parent.wait()
    text = (tmp_path / "api.log").read_text()
    assert code == 1, text[-3000:]
    assert "Address already in use" in text
    # The parent exits only once it has joined every worker: none is left serving.
    assert "API worker memoryd-api-1 ended with exit code 1" in text


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
