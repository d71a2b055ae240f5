"""A Chroma server of the test's own, which the test may stop or freeze (SIGSTOP).

Like the fixtures' services, it is stopped by a watchdog if the test run dies without a teardown.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from memoryd.dev import free_port
from memoryd.dev._process import Lifeline, ServiceProcess, write_pid


class DisposableChroma:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._lifeline: Lifeline | None = None

    @property
    def _process(self) -> ServiceProcess:
        return ServiceProcess(self.home / "chroma.pid", marker=str(self.home / "data"))

    def start(self, timeout: float = 60.0) -> None:
        if self._lifeline is None:
            self._lifeline = self._process.stop_on_exit(
                log_path=self.home / "watchdog.log", timeout=20.0
            )
        exe = Path(sys.executable).parent / "chroma"
        env = {**os.environ, "ANONYMIZED_TELEMETRY": "False", "NO_COLOR": "1"}
        with (self.home / "chroma.log").open("ab") as log:
            self._proc = subprocess.Popen(
                [
                    str(exe),
                    "run",
                    "--path",
                    str(self.home / "data"),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        write_pid(self._process.pid_file, self._proc.pid)
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                log_text = (self.home / "chroma.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"chroma run did not start:\n{log_text}")
            time.sleep(0.1)

    def freeze(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: no shutdown of any kind; `start()` brings it back on the same port."""
        proc, self._proc = self._proc, None
        assert proc is not None
        proc.kill()
        proc.wait(timeout=20)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # a frozen process cannot handle SIGTERM
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=20)
        if self._lifeline is not None:
            self._lifeline.release()
            self._lifeline = None

    def _answers(self) -> bool:
        try:
            resp = httpx.get(f"{self.url}/api/v2/heartbeat", timeout=1.0, trust_env=False)
        except httpx.HTTPError:
            return False
        return resp.is_success
