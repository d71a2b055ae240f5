"""Process plumbing shared by the local service launchers.

The services run as detached children (own session, output to a log file, stdin closed) so that
`memoryd dev up` can return while they keep running and a Ctrl-C in the terminal does not reach
them. Each launcher records the child's pid in its home dir, which is how a later, different
process (`memoryd dev down`) finds it again. A pid alone is not trusted: before signalling we
check that /proc/PID/cmdline still mentions the service's home dir, so a recycled pid belonging
to something else is never killed.

A service started for a test session must not outlive it, however the session ends (a CI job
SIGKILLed on its time limit runs no teardown). stop_on_exit() gives such a service a watchdog: this
module run as a script, in a session of its own so that a signal to the test run's process group
does not take it down with the run. It blocks reading a pipe whose only write end the starting
process holds; the kernel closes that end when the process dies, and the watchdog then stops the
service if it is still running. `memoryd dev up` does not use it: its services outlive the command.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_STDERR = 2


class ServiceError(RuntimeError):
    """A local service could not be prepared, started or stopped."""


class PortTaken(ServiceError):
    """The port a service was to listen on is taken: worth a new start on another port."""


def _inheritable_fds() -> list[int]:
    fds = []
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the fd listdir itself used is already closed
            if os.get_inheritable(int(name)):
                fds.append(int(name))
    return fds


def spawn_detached(
    argv: Sequence[str],
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    stdin_fd: int | None = None,
) -> int:
    """Start argv (argv[0] an absolute path) in a new session, output appended to log_path.

    stdin is /dev/null, or the descriptor stdin_fd if given.

    os.posix_spawn rather than subprocess.Popen: a Popen object must be waited on by the process
    that made it, or it warns (ResourceWarning) when collected, which is exactly what happens
    when `memoryd dev up` exits and leaves the services running. With a bare pid we reap our own
    children in terminate() and let init reap them once we are gone.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        actions: list[tuple[Any, ...]] = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)
            if stdin_fd is None
            else (os.POSIX_SPAWN_DUP2, stdin_fd, 0),
            (os.POSIX_SPAWN_DUP2, log_fd, 1),
            (os.POSIX_SPAWN_DUP2, log_fd, 2),
        ]
        # Like Popen(close_fds=True): a daemon must not hold open descriptors we inherited
        # (a CI log pipe, say), or whoever reads that pipe waits for EOF forever.
        actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in _inheritable_fds() if fd > _STDERR]
        return os.posix_spawn(
            argv[0],
            list(argv),
            dict(os.environ if env is None else env),
            file_actions=actions,
            setsid=True,
        )
    finally:
        os.close(log_fd)


def write_pid(path: Path, pid: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{pid}\n", encoding="ascii")
    tmp.replace(path)  # atomic: a reader never sees a half-written pid


def read_pid(path: Path) -> int | None:
    """The pid on the first line of path (ours hold only that; Postgres' postmaster.pid more)."""
    try:
        return int(path.read_text(encoding="ascii", errors="replace").split("\n", 1)[0])
    except (FileNotFoundError, ValueError):
        return None


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    # The state letter follows the parenthesised command name, which may itself contain spaces.
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def pid_alive(pid: int) -> bool:
    """True if pid exists and is not a zombie (a zombie has exited, it just awaits reaping)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    return not _is_zombie(pid)


def pid_cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace")


def owned_pid(pid_file: Path, marker: str) -> int | None:
    """The live pid recorded in pid_file, if its command line contains marker."""
    pid = read_pid(pid_file)
    if pid is None or not pid_alive(pid) or marker not in pid_cmdline(pid):
        return None
    return pid


def exited(pid: int) -> bool:
    """True once pid has exited; reaps it if it is our child, so no zombie is left behind."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child (started by another process): init reaps it
        return not pid_alive(pid)
    return done == pid


def _signal_group(pid: int, sig: signal.Signals) -> None:
    # Children are session leaders, so their pgid is their pid: signal the whole group in case
    # the service forked helpers. Fall back to the single pid if the group is already gone.
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def terminate(pid: int, timeout: float, sig: signal.Signals = signal.SIGTERM) -> None:
    """Send sig to the process group, wait up to timeout, then SIGKILL and wait again."""
    if exited(pid):
        return
    _signal_group(pid, sig)
    if wait_until(lambda: exited(pid), timeout):
        return
    _signal_group(pid, signal.SIGKILL)
    if not wait_until(lambda: exited(pid), timeout):
        raise ServiceError(f"process {pid} survived SIGKILL for {timeout:.0f}s")


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True if something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def log_size(path: Path) -> int:
    """Where the next line appended to the log at path will start."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def logged_since(path: Path, offset: int) -> str:
    """What was appended to the log at path past offset (see log_size)."""
    try:
        with path.open("rb") as log:
            log.seek(offset)
            return log.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def ensure_port_free(host: str, port: int, owner: str) -> None:
    """Raise unless host:port is free: something listening there is not the service of owner."""
    if port_open(host, port):
        raise PortTaken(
            f"{host}:{port} is already taken by a process that is not {owner}; pick another port"
        )


@dataclass(frozen=True)
class ServiceProcess:
    """A local service's pid file, and the text its command line must contain to be ours."""

    pid_file: Path
    marker: str

    def owned(self) -> int | None:
        """The live pid this service recorded, if it is still the service's process."""
        return owned_pid(self.pid_file, self.marker)

    def spawn(
        self, argv: Sequence[str], *, log_path: Path, env: Mapping[str, str] | None = None
    ) -> int:
        pid = spawn_detached(argv, log_path=log_path, env=env)
        write_pid(self.pid_file, pid)
        return pid

    def stop_on_exit(
        self, *, log_path: Path, timeout: float, sig: signal.Signals = signal.SIGTERM
    ) -> Lifeline:
        """A watchdog that stops this service (sig, SIGKILL after timeout) once the returned
        Lifeline is released or this process exits, whichever comes first."""
        read_fd, write_fd = os.pipe()  # both non-inheritable: no other child gets the write end
        try:
            argv = [
                str(Path(sys.executable).absolute()),
                "-I",  # no script dir on sys.path: memoryd/dev/kafka.py must not shadow kafka
                str(Path(__file__).absolute()),
                str(self.pid_file),
                self.marker,
                sig.name,
                str(timeout),
            ]
            pid = spawn_detached(argv, log_path=log_path, stdin_fd=read_fd)
        except BaseException:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
        return Lifeline(pid, write_fd)

    def stop(self, started: int | None, timeout: float) -> None:
        """SIGTERM the service, SIGKILL after timeout; reap started if it died by itself."""
        pid = self.owned()
        if pid is not None:
            terminate(pid, timeout)
        elif started is not None:
            exited(started)  # it died by itself: reap it (a zombie does not count as owned)
        self.pid_file.unlink(missing_ok=True)


@dataclass
class Lifeline:
    """The write end of a watchdog's pipe (see stop_on_exit), and the watchdog's pid."""

    pid: int
    fd: int | None

    def release(self, timeout: float = 5.0) -> None:
        """Close the pipe: the watchdog stops the service if it still runs, then exits; reap it.
        Idempotent. Release after stopping the service, so the watchdog has nothing to do."""
        fd, self.fd = self.fd, None
        if fd is None:
            return
        os.close(fd)
        if not wait_until(lambda: exited(self.pid), timeout):
            raise ServiceError(f"the watchdog {self.pid} did not exit in {timeout:.0f}s")


def _watch(pid_file: str, marker: str, sig: str, timeout: str) -> None:
    """Wait for the end of the pipe on stdin, then stop the service if it is still ours."""
    # Our own session has no terminal, but a Ctrl-C sent to the run's group must not reach us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while os.read(0, 4096):  # nothing is ever written: this returns b"" once the end closes
        pass
    pid = owned_pid(Path(pid_file), marker)
    if pid is not None:
        terminate(pid, float(timeout), signal.Signals[sig])


if __name__ == "__main__":
    # Run by path from stop_on_exit, so that only the standard library is imported (the
    # memoryd.dev package imports kafka-python, httpx and psycopg: 0.6 s for each watchdog).
    _watch(*sys.argv[1:])
