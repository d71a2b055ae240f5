"""A Chroma server of the test's own, which the test may stop, kill or freeze (SIGSTOP).

Like the fixtures' services, it is stopped by a watchdog if the test run dies without a teardown.
Start the first one with tests.support.services.started: its port is picked, and another process
may take it before the server binds it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from memoryd.dev import LocalChroma, free_port
from memoryd.dev._process import exited, wait_until


class DisposableChroma(LocalChroma):
    def __init__(self, home: Path, port: int | None = None) -> None:
        super().__init__(home, free_port() if port is None else port, stop_on_exit=True)

    @property
    def _started_pid(self) -> int:
        assert self._pid is not None, "the server is not running"
        return self._pid

    @property
    def running(self) -> bool:
        """Started, and not stopped or killed since (a frozen server is running)."""
        return self._pid is not None

    def freeze(self) -> None:
        os.kill(self._started_pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self._started_pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: no shutdown of any kind; `start()` brings it back on the same port."""
        pid = self._started_pid
        os.kill(pid, signal.SIGKILL)
        if not wait_until(lambda: exited(pid), 20.0):
            raise AssertionError(f"chroma {pid} survived SIGKILL")
        self._pid = None

    def stop(self, timeout: float = 20.0) -> None:
        if self._pid is not None and not exited(self._pid):
            os.kill(self._pid, signal.SIGCONT)  # a frozen process cannot handle SIGTERM
        super().stop(timeout)
