"""A real single-node Kafka 4 broker (KRaft, broker and controller in one JVM), without Docker.

The broker jars come from Maven Central through infra/kafka/pom.xml, because Maven Central is the
only Java artifact source our machines reach (the Apache download mirrors are not). They are
copied once into a cache directory keyed by a hash of the pom, so editing the pom (e.g. bumping
kafka.version) fetches a fresh set while repeated runs fetch nothing.

Everything else lives in `home`: server.properties, the log4j2 config, the KRaft log dir, the
broker log and the pid file. Storage is formatted once; later starts reuse the data.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import logging
import os
import re
import shutil
import subprocess
import time
import uuid
import warnings
from pathlib import Path

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
    port_open,
)

with warnings.catch_warnings():
    # kafka-python 3.0.12 loads its protocol schemas with importlib.resources.read_text/open_text,
    # which warn on Python 3.11/3.12; under `-W error` the import itself would crash.
    warnings.filterwarnings("ignore", r"(read|open)_text is deprecated", DeprecationWarning)
    from kafka import KafkaAdminClient  # type: ignore[import-untyped,unused-ignore]
    from kafka.errors import KafkaError  # type: ignore[import-untyped,unused-ignore]

    from producers.kafka_clients import open_client

log = logging.getLogger(__name__)

_HOST = "127.0.0.1"
_STOP_TIMEOUT_S = 30.0
_COMPLETE_MARKER = ".complete"


def _cluster_id() -> str:
    # Kafka cluster ids are 16 random bytes in unpadded url-safe base64 (22 chars). One starting
    # with '-' would be parsed as a command-line option by StorageTool, so draw again.
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")
        if not cid.startswith("-"):
            return cid


def probe_kafka(bootstrap: str, timeout_ms: int = 5000) -> None:
    """Raise unless the broker at bootstrap answers a metadata request (a real readiness check:
    in KRaft the port can accept connections before the broker has caught up on metadata)."""
    admin = open_client(
        KafkaAdminClient,
        bootstrap_servers=bootstrap,
        client_id="memoryd-dev-probe",
        request_timeout_ms=timeout_ms,
        bootstrap_timeout_ms=timeout_ms,
    )
    try:
        admin.list_topics()
    finally:
        admin.close()


def kafka_ready(bootstrap: str, timeout_ms: int = 5000) -> bool:
    try:
        probe_kafka(bootstrap, timeout_ms)
    except (KafkaError, OSError):
        return False
    return True


def _find_java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str((Path(java_home) / "bin" / "java").absolute())
    java = shutil.which("java")
    if java is None:
        raise ServiceError("java not found (set JAVA_HOME or put java on PATH); Kafka needs 17+")
    return str(Path(java).absolute())  # spawn_detached does not search PATH


class LocalKafka:
    """One KRaft broker+controller listening on 127.0.0.1:port (controller on controller_port).

    stop_on_exit: the broker is stopped when the process that started it exits, however it
    exits (for tests; see memoryd.dev._process).
    """

    def __init__(
        self,
        home: Path,
        port: int,
        controller_port: int,
        pom: Path,
        jars_cache: Path,
        *,
        heap: str = "512m",
        stop_on_exit: bool = False,
    ) -> None:
        self.home = home.absolute()  # pid-file checks compare command lines: no relative paths
        self.port = port
        self.controller_port = controller_port
        self.pom = pom
        self.jars_cache = jars_cache
        self.heap = heap
        self.stop_on_exit = stop_on_exit
        self._pid: int | None = None  # the broker process this object started or adopted
        self._lifeline: Lifeline | None = None

    @property
    def bootstrap(self) -> str:
        return f"{_HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The broker process this object started or adopted; None while stopped."""
        return self._pid

    @property
    def _props(self) -> Path:
        return self.home / "server.properties"

    @property
    def _process(self) -> ServiceProcess:
        return ServiceProcess(self.home / "kafka.pid", marker=str(self._props))

    @property
    def _data_dir(self) -> Path:
        return self.home / "data"

    @property
    def _logs_dir(self) -> Path:
        return self.home / "logs"

    @property
    def _stdout_log(self) -> Path:
        return self._logs_dir / "stdout.log"

    @property
    def _server_log(self) -> Path:
        return self._logs_dir / "server.log"

    def ensure_jars(self) -> Path:
        """Return a directory holding the broker jars, running Maven only if it is not cached."""
        key = hashlib.sha256(self.pom.read_bytes()).hexdigest()[:16]
        libs = self.jars_cache / key
        if (libs / _COMPLETE_MARKER).exists():
            return libs
        self.jars_cache.mkdir(parents=True, exist_ok=True)
        # A lock, because parallel test sessions sharing the cache would otherwise both download
        # into and rename over the same directory.
        with (self.jars_cache / f"{key}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if (libs / _COMPLETE_MARKER).exists():
                return libs
            self._download_jars(libs)
        return libs

    def _download_jars(self, libs: Path) -> None:
        mvn = shutil.which("mvn")
        if mvn is None:
            raise ServiceError("mvn not found on PATH; it is needed once to fetch the Kafka jars")
        # Said, because this is the one step of a start that can take minutes.
        log.info("fetching the Kafka jars from Maven Central into %s (once)", libs)
        partial = libs.with_name(libs.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(libs, ignore_errors=True)
        argv = [
            mvn, "-q", "-B", "-Dstyle.color=never", "-f", str(self.pom),
            "dependency:copy-dependencies", "-DincludeScope=runtime",
            f"-DoutputDirectory={partial}",
        ]  # fmt: skip
        result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=900)
        if result.returncode != 0 or not any(partial.glob("kafka_*.jar")):
            raise ServiceError(
                f"fetching Kafka jars failed (exit {result.returncode}): {' '.join(argv)}\n"
                f"{result.stdout[-4000:]}{result.stderr[-4000:]}"
            )
        (partial / _COMPLETE_MARKER).write_text(self.pom.read_text(encoding="utf-8"), "utf-8")
        partial.rename(libs)

    def is_running(self) -> bool:
        return self._process.owned() is not None

    def start(self, timeout: float = 120.0) -> str:
        """Start the broker (or adopt ours if already running) and return its bootstrap address.

        timeout is the broker's time to answer once launched; fetching the jars and formatting
        the storage on a first start have limits of their own.
        """
        self._pid = self._process.owned()
        if self._pid is not None and self._running_ports() != (self.port, self.controller_port):
            self.stop()  # running on other ports from an earlier configuration
        if self.stop_on_exit and self._lifeline is None:
            # Before the spawn: a process killed while the broker starts up stops it too.
            self._lifeline = self._process.stop_on_exit(
                log_path=self._logs_dir / "watchdog.log", timeout=_STOP_TIMEOUT_S
            )
        if self._pid is not None:
            self._wait_ready(time.monotonic() + timeout)
            return self.bootstrap
        for p in (self.port, self.controller_port):
            ensure_port_free(_HOST, p, f"the broker of {self.home}")
        libs = self.ensure_jars()
        java = _find_java()
        self._write_config()
        if not (self._data_dir / "meta.properties").exists():
            self._format(java, libs)
        argv = [
            java, f"-Xmx{self.heap}", "-XX:+UseG1GC", "-XX:+ExitOnOutOfMemoryError",
            f"-XX:ErrorFile={self._logs_dir}/hs_err_pid%p.log",  # not in whatever cwd we have
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self._logs_dir}",
            "-cp", f"{libs}/*", "kafka.Kafka", str(self._props),
        ]  # fmt: skip
        logs = (self._server_log, self._stdout_log)
        logged = [log_size(log) for log in logs]
        self._pid = self._process.spawn(argv, log_path=self._stdout_log)
        try:
            # Counted from the launch: a first jar download can take minutes, and charging it
            # to the broker would kill one that was about to answer.
            self._wait_ready(time.monotonic() + timeout)
        except ServiceError as e:
            self.stop()
            # A port taken since ensure_port_free looked (by a parallel run, say).
            new = "".join(logged_since(log, at) for log, at in zip(logs, logged, strict=True))
            if "Address already in use" in new:
                raise PortTaken(str(e)) from e
            raise
        return self.bootstrap

    def stop(self, timeout: float = _STOP_TIMEOUT_S) -> None:
        """Stop the broker (controlled shutdown on SIGTERM, SIGKILL after timeout). Idempotent."""
        self._process.stop(self._pid, timeout)
        self._pid = None
        if self._lifeline is not None:
            self._lifeline.release()
            self._lifeline = None

    def _running_ports(self) -> tuple[int, int] | None:
        """The client and controller ports of the running broker's config (written at its start)."""
        try:
            text = self._props.read_text("utf-8")
        except OSError:
            return None
        listeners = next((ln for ln in text.splitlines() if ln.startswith("listeners=")), "")
        ports = dict(re.findall(r"(PLAINTEXT|CONTROLLER)://[^,]*:(\d+)", listeners))
        if set(ports) != {"PLAINTEXT", "CONTROLLER"}:
            return None
        return int(ports["PLAINTEXT"]), int(ports["CONTROLLER"])

    def _write_config(self) -> None:
        self._logs_dir.mkdir(parents=True, exist_ok=True)
        self._data_dir.mkdir(parents=True, exist_ok=True)
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{_HOST}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{_HOST}:{self.port},CONTROLLER://{_HOST}:"
            f"{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{_HOST}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self._data_dir),
            # memoryd declares every topic it uses; a typo must fail, not invent a topic.
            "auto.create.topics.enable": "false",
            "num.partitions": "1",
            # A single node cannot satisfy the production defaults of 3 replicas.
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            # Tests join groups constantly; the default 3 s delay would slow every one of them.
            "group.initial.rebalance.delay.ms": "0",
            # The fault tests stop members and the broker itself for longer than a session
            # timeout; the default floor of 6 s would make each of them wait that much more.
            "group.min.session.timeout.ms": "1000",
        }
        self._props.write_text("".join(f"{k}={v}\n" for k, v in settings.items()), "utf-8")
        log4j = (
            "status = warn\n"
            # Kafka has its own shutdown hook; log4j's would race it and warn on every stop.
            "shutdownHook = disable\n"
            "appender.file.type = File\n"
            "appender.file.name = FILE\n"
            f"appender.file.fileName = {self._server_log}\n"
            "appender.file.layout.type = PatternLayout\n"
            "appender.file.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = INFO\n"
            "rootLogger.appenderRef.file.ref = FILE\n"
        )
        (self.home / "log4j2.properties").write_text(log4j, "utf-8")

    def _format(self, java: str, libs: Path) -> None:
        argv = [
            java, f"-Dlog4j2.configurationFile={self.home / 'log4j2.properties'}",
            "-cp", f"{libs}/*", "kafka.tools.StorageTool", "format",
            "-t", _cluster_id(), "-c", str(self._props), "--ignore-formatted",
        ]  # fmt: skip
        result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
        if result.returncode != 0:
            raise ServiceError(
                f"formatting Kafka storage in {self._data_dir} failed:\n"
                f"{result.stdout[-4000:]}{result.stderr[-4000:]}"
            )

    def _wait_ready(self, deadline: float) -> None:
        """Block until the broker answers a metadata request, or raise with its log tail."""
        last_error = "port never opened"
        while time.monotonic() < deadline:
            if self._pid is not None and exited(self._pid):
                raise self._failure("the broker process exited")
            if port_open(_HOST, self.port):
                try:
                    probe_kafka(self.bootstrap)
                    return
                except (KafkaError, OSError) as exc:
                    last_error = repr(exc)
            time.sleep(0.25)
        raise self._failure(f"the broker was not ready in time (last error: {last_error})")

    def _failure(self, what: str) -> ServiceError:
        return ServiceError(
            f"Kafka on {self.bootstrap} ({self.home}): {what}\n"
            f"--- tail of {self._server_log} ---\n"
            f"{log_tail(self._server_log)}\n"
            f"--- tail of {self._stdout_log} ---\n{log_tail(self._stdout_log, 20)}"
        )
