"""A real Chroma server (`chroma run`, shipped in the chromadb wheel) persisting to home/data.

The same server a Docker image would run, so the HTTP client path (chromadb.HttpClient) is
exercised for real rather than through the in-process client.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path

import httpx

from memoryd.dev._process import (
    Lifeline,
    PortTaken,
    ServiceError,
    ServiceProcess,
    ensure_port_free,
    exited,
    log_size,
    log_tail,
    logged_since,
    pid_cmdline,
)

_HOST = "127.0.0.1"
_STOP_TIMEOUT_S = 20.0


# What the `chroma` console script ends up calling, minus its `import chromadb`: that import
# alone takes ~1.5 s idle and 7 s on a loaded CI box, while the native module loads in 0.2 s.
_FAST_LAUNCH = (
    "import sys, chromadb_rust_bindings; chromadb_rust_bindings.cli(['chroma', *sys.argv[1:]])"
)


def find_chroma_exe() -> Path:
    """The `chroma` console script of the running interpreter's environment, else PATH's."""
    # Prefer the one next to sys.executable: it belongs to the chromadb our code imports, even
    # when the virtualenv is not activated (no bin/ on PATH).
    beside = Path(sys.executable).parent / "chroma"
    if beside.is_file():
        return beside
    found = shutil.which("chroma")
    if found is None:
        raise ServiceError("the `chroma` command was not found (pip install chromadb)")
    return Path(found)


def heartbeat(url: str, timeout: float = 2.0) -> bool:
    """True if the Chroma server at url answers GET /api/v2/heartbeat."""
    try:
        # trust_env=False: a proxy from the environment must not intercept 127.0.0.1.
        resp = httpx.get(f"{url}/api/v2/heartbeat", timeout=timeout, trust_env=False)
        body = resp.json() if resp.is_success else None
    except (httpx.HTTPError, ValueError):  # ValueError: a non-JSON answer from something else
        return False
    return isinstance(body, dict) and "nanosecond heartbeat" in body


class LocalChroma:
    """A Chroma server on 127.0.0.1:port with its data in home/data.

    stop_on_exit: the server is stopped when the process that started it exits, however it
    exits (for tests; see memoryd.dev._process).
    """

    def __init__(
        self,
        home: Path,
        port: int,
        chroma_exe: Path | None = None,
        *,
        stop_on_exit: bool = False,
    ) -> None:
        self.home = home.absolute()  # pid-file checks compare command lines: no relative paths
        self.port = port
        self.chroma_exe = chroma_exe
        self.stop_on_exit = stop_on_exit
        self._pid: int | None = None  # the server process this object started or adopted
        self._lifeline: Lifeline | None = None

    @property
    def url(self) -> str:
        return f"http://{_HOST}:{self.port}"

    @property
    def _data(self) -> Path:
        return self.home / "data"

    @property
    def _process(self) -> ServiceProcess:
        return ServiceProcess(self.home / "chroma.pid", marker=str(self._data))

    @property
    def _log(self) -> Path:
        return self.home / "chroma.log"

    def is_running(self) -> bool:
        return self._process.owned() is not None

    def start(self, timeout: float = 60.0) -> str:
        """Start the server (or adopt ours if already running) and return its base URL."""
        deadline = time.monotonic() + timeout
        self._pid = self._process.owned()
        if self._pid is not None and self._running_port(self._pid) != self.port:
            self.stop()  # running on another port from an earlier configuration
        if self.stop_on_exit and self._lifeline is None:
            # Before the spawn: a process killed while the server starts up stops it too.
            self._lifeline = self._process.stop_on_exit(
                log_path=self.home / "watchdog.log", timeout=_STOP_TIMEOUT_S
            )
        logged = log_size(self._log)
        if self._pid is None:
            ensure_port_free(_HOST, self.port, f"the Chroma server of {self.home}")
            self._data.mkdir(parents=True, exist_ok=True)
            env = dict(os.environ)
            # No phoning home from dev machines and CI (and no hanging on it when offline).
            env["ANONYMIZED_TELEMETRY"] = "False"
            env["NO_COLOR"] = "1"
            args = ["run", "--path", str(self._data), "--host", _HOST, "--port", str(self.port)]
            self._pid = self._process.spawn(self._launcher() + args, log_path=self._log, env=env)
        while time.monotonic() < deadline:
            if heartbeat(self.url, timeout=1.0):
                return self.url
            if exited(self._pid):
                break
            time.sleep(0.1)
        status = "exited" if exited(self._pid) else "hung"
        self.stop()
        # Taken since ensure_port_free looked (by a parallel run, say), in chroma's own words.
        taken = f"Address {_HOST}:{self.port} is not available" in logged_since(self._log, logged)
        raise (PortTaken if taken else ServiceError)(
            f"Chroma on {self.url} did not answer its heartbeat ({status})\n"
            f"--- tail of {self._log} ---\n{log_tail(self._log)}"
        )

    @staticmethod
    def _running_port(pid: int) -> int | None:
        args = pid_cmdline(pid).split()
        try:
            return int(args[args.index("--port") + 1])
        except (ValueError, IndexError):
            return None

    def _launcher(self) -> list[str]:
        if self.chroma_exe is not None:
            return [str(self.chroma_exe.absolute())]
        if importlib.util.find_spec("chromadb_rust_bindings") is not None:
            return [str(Path(sys.executable).absolute()), "-c", _FAST_LAUNCH]
        return [str(find_chroma_exe().absolute())]

    def stop(self, timeout: float = _STOP_TIMEOUT_S) -> None:
        """SIGTERM (Chroma shuts down cleanly on it), SIGKILL after timeout. Idempotent."""
        self._process.stop(self._pid, timeout)
        self._pid = None
        if self._lifeline is not None:
            self._lifeline.release()
            self._lifeline = None
