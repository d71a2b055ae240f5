"""A real PostgreSQL server in a private data directory, run from the distribution's binaries.

initdb and postgres refuse to run as root, and our CI runs as root on fresh machines. So when we
are root, every Postgres binary runs as an unprivileged OS user (the packaged `postgres` user,
created with `useradd --system` if it is missing), the home dir is handed to that user, and any
ancestor directory that user cannot traverse (pytest's 0700 /tmp/pytest-of-root, /root, ...)
gets the search bit for others: traverse only, no listing.

The server listens on 127.0.0.1 only, with trust authentication (no passwords in dev/test DSNs).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
from pathlib import Path
from typing import Any

import psycopg
from psycopg import errors, sql

from memoryd.dev._process import (
    Lifeline,
    PortTaken,
    ServiceError,
    ServiceProcess,
    ensure_port_free,
    log_size,
    log_tail,
    logged_since,
)

log = logging.getLogger(__name__)

_HOST = "127.0.0.1"
_SUPERUSER = "postgres"
_STOP_TIMEOUT_S = 60.0
# sockaddr_un.sun_path is 108 bytes on Linux, including the NUL.
_MAX_SOCKET_PATH = 107


def find_bin_dir() -> Path:
    """The directory holding initdb, pg_ctl and postgres: PATH first, then the newest Debian one."""
    on_path = shutil.which("pg_ctl")
    if on_path is not None:
        # Resolve symlinks (/usr/local/bin/pg_ctl -> /usr/lib/postgresql/15/bin/pg_ctl) so that
        # initdb and postgres come from the same installation as pg_ctl.
        candidate = Path(on_path).resolve().parent
        if (candidate / "initdb").is_file():
            return candidate

    def version(p: Path) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", p.parent.name))

    installed = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "pg_ctl").is_file()]
    if not installed:
        raise ServiceError(
            "PostgreSQL server binaries not found on PATH or in "
            "/usr/lib/postgresql/*/bin (Debian: apt-get install postgresql)"
        )
    return max(installed, key=version)


def _ensure_os_user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    argv = [
        "useradd",
        "--system",
        "--user-group",
        "--no-create-home",
        "--home-dir",
        "/nonexistent",
        "--shell",
        "/usr/sbin/nologin",
        name,
    ]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    try:
        return pwd.getpwnam(name)  # also covers losing a race with a parallel useradd
    except KeyError:
        raise ServiceError(
            f"could not create OS user {name!r} to run Postgres as: {result.stderr.strip()}"
        ) from None


def _grant_search(path: Path, user: pwd.struct_passwd) -> None:
    """Make every directory from / down to path traversable by user."""
    groups = set(os.getgrouplist(user.pw_name, user.pw_gid))
    for directory in [*reversed(path.parents), path]:
        st = directory.stat()
        if st.st_uid == user.pw_uid:
            bit = stat.S_IXUSR
        elif st.st_gid in groups:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            log.warning(
                "granting search permission (o+x) on %s so that OS user %s can reach %s",
                directory,
                user.pw_name,
                path,
            )
            directory.chmod(stat.S_IMODE(st.st_mode) | stat.S_IXOTH)


def _chown_tree(root: Path, user: pwd.struct_passwd) -> None:
    for entry in [root, *root.rglob("*")]:
        if entry.lstat().st_uid != user.pw_uid:
            os.chown(entry, user.pw_uid, user.pw_gid, follow_symlinks=False)


class LocalPostgres:
    """A PostgreSQL cluster in home/data serving database `database` on 127.0.0.1:port.

    stop_on_exit: the server is stopped when the process that started it exits, however it
    exits (for tests; see memoryd.dev._process).
    """

    def __init__(
        self,
        home: Path,
        port: int,
        bin_dir: Path | None = None,
        *,
        for_tests: bool = False,
        database: str = "memoryd",
        os_user: str = "postgres",
        stop_on_exit: bool = False,
    ) -> None:
        self.home = home.absolute()  # pg tools run with cwd=home, so no relative paths
        self.port = port
        self.bin_dir = bin_dir
        self.for_tests = for_tests
        self.database = database
        self.os_user = os_user
        self.stop_on_exit = stop_on_exit
        self._lifeline: Lifeline | None = None

    @property
    def dsn(self) -> str:
        return f"postgresql://{_SUPERUSER}@{_HOST}:{self.port}/{self.database}"

    @property
    def _data(self) -> Path:
        return self.home / "data"

    @property
    def _log(self) -> Path:
        return self.home / "postgres.log"

    def start(self, timeout: float = 60.0) -> str:
        """Initialise (once) and start the server, create the database; return its DSN."""
        self._prepare_home()
        if not (self._data / "PG_VERSION").exists():
            self._initdb()
        self._write_settings()
        if self.is_running() and self._running_port() != self.port:
            self.stop()  # running on another port from an earlier configuration
        if self.stop_on_exit and self._lifeline is None:
            # Before the start: a process killed while the server starts up stops it too. The
            # postmaster records its pid in postmaster.pid and is started with -D data; SIGINT
            # is its fast shutdown, what `pg_ctl stop -m fast` sends.
            postmaster = ServiceProcess(self._data / "postmaster.pid", marker=str(self._data))
            self._lifeline = postmaster.stop_on_exit(
                log_path=self.home / "watchdog.log", timeout=_STOP_TIMEOUT_S, sig=signal.SIGINT
            )
        if self.is_running():
            self._ensure_database()
            return self.dsn
        ensure_port_free(_HOST, self.port, f"the Postgres server of {self.home}")
        logged = log_size(self._log)
        result = self._pg_ctl("start", "-w", "-t", str(int(timeout)), "-l", str(self._log))
        if result.returncode != 0:
            # A port taken since ensure_port_free looked (by a parallel run, say).
            taken = "Address already in use" in logged_since(self._log, logged)
            raise (PortTaken if taken else ServiceError)(
                f"pg_ctl start failed for {self._data}:\n{result.stdout}"
                f"{result.stderr}\n--- tail of {self._log} ---\n"
                f"{log_tail(self._log)}"
            )
        self._ensure_database()
        return self.dsn

    def stop(self, timeout: float = _STOP_TIMEOUT_S) -> None:
        """Fast shutdown (disconnects clients, no crash recovery needed). Idempotent."""
        if self.is_running():
            result = self._pg_ctl("stop", "-m", "fast", "-w", "-t", str(int(timeout)))
            if result.returncode != 0 and self.is_running():
                raise ServiceError(f"pg_ctl stop failed for {self._data}:\n{result.stderr}")
        if self._lifeline is not None:
            self._lifeline.release()
            self._lifeline = None

    def is_running(self) -> bool:
        if not (self._data / "PG_VERSION").exists():
            return False
        # pg_ctl status exits 0 when a live postmaster owns the data directory.
        return self._pg_ctl("status").returncode == 0

    # --- internals -------------------------------------------------------------------------

    def _bins(self) -> Path:
        bins = self.bin_dir or find_bin_dir()
        for tool in ("initdb", "pg_ctl", "postgres"):
            if not (bins / tool).is_file():
                raise ServiceError(f"{bins / tool} not found")
        return bins

    def _run_as(self) -> pwd.struct_passwd | None:
        return _ensure_os_user(self.os_user) if os.geteuid() == 0 else None

    def _run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        # Strip PG* variables: a developer's PGDATA/PGPORT/PGHOST must not leak into our cluster.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        kwargs: dict[str, Any] = {}
        user = self._run_as()
        if user is not None:
            kwargs = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
            env["HOME"] = str(self.home)
        # The server itself is started by pg_ctl in its own session and outlives this call;
        # its output goes to the -l log file, not to these pipes.
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            check=False,
            env=env,
            cwd=self.home,
            timeout=300,
            **kwargs,
        )

    def _pg_ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self._run([str(self._bins() / "pg_ctl"), "-D", str(self._data), *args])

    def _prepare_home(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "run").mkdir(exist_ok=True)
        user = self._run_as()
        if user is not None:
            _grant_search(self.home, user)
            _chown_tree(self.home, user)

    def _initdb(self) -> None:
        # A data dir without PG_VERSION is the debris of an interrupted initdb: start over.
        shutil.rmtree(self._data, ignore_errors=True)
        argv = [
            str(self._bins() / "initdb"),
            "-D",
            str(self._data),
            "-U",
            _SUPERUSER,
            "-E",
            "UTF8",
            "--locale=C",
            "--auth=trust",
        ]
        if self.for_tests:
            argv.append("--no-sync")  # skip fsyncing the fresh cluster: seconds saved per session
        result = self._run(argv)
        if result.returncode != 0:
            raise ServiceError(f"initdb failed for {self._data}:\n{result.stdout}{result.stderr}")
        # Only TCP from 127.0.0.1 and the socket in our private run dir; never ::1 or the LAN.
        (self._data / "pg_hba.conf").write_text(
            "local all all trust\nhost all all 127.0.0.1/32 trust\n", "utf-8"
        )
        with (self._data / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.write("\ninclude_if_exists = 'memoryd.conf'\n")

    def _write_settings(self) -> None:
        # Rewritten on every start so that a changed port or for_tests flag takes effect.
        run_dir = self.home / "run"
        socket_path = f"{run_dir}/.s.PGSQL.{self.port}"
        # A home too deep for a unix socket path gets TCP only; pg_ctl -w does not need a socket.
        sockets = str(run_dir) if len(socket_path) <= _MAX_SOCKET_PATH else ""
        lines = [
            f"port = {self.port}",
            f"listen_addresses = '{_HOST}'",
            f"unix_socket_directories = '{sockets}'",
            "max_connections = 200",  # headroom: tests open a connection pool per test
        ]
        if self.for_tests:
            # Durability is worthless for throwaway test clusters and costs seconds per test.
            lines += ["fsync = off", "synchronous_commit = off", "full_page_writes = off"]
        conf = self._data / "memoryd.conf"
        conf.write_text("\n".join(lines) + "\n", "utf-8")
        user = self._run_as()
        if user is not None:
            os.chown(conf, user.pw_uid, user.pw_gid)

    def _running_port(self) -> int | None:
        try:
            lines = (self._data / "postmaster.pid").read_text(encoding="utf-8").splitlines()
            return int(lines[3])
        except (OSError, IndexError, ValueError):
            return None

    def _ensure_database(self) -> None:
        admin = f"host={_HOST} port={self.port} user={_SUPERUSER} dbname=postgres"
        with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (self.database,)
            ).fetchone()
            if exists is None:
                # DuplicateDatabase: created concurrently by another start(), as we wanted.
                with contextlib.suppress(errors.DuplicateDatabase):
                    conn.execute(
                        sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.database))
                    )
