"""The whole local stack (Kafka, Postgres, Chroma) behind one up()/down() pair, for the CLI.

up() starts the three services concurrently (Kafka's JVM dominates: ~5 s; the others take about a
second), is idempotent, and records the endpoints in state_dir/endpoints.json so that other
processes (a worker, a test run pointed at the dev stack) can find them. Nothing is printed here:
the CLI decides how to present the returned DevEndpoints.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Protocol

from memoryd.dev._process import ServiceError
from memoryd.dev.chroma import LocalChroma
from memoryd.dev.kafka import LocalKafka
from memoryd.dev.postgres import LocalPostgres

# Where infra/kafka/pom.xml sits in a source checkout (memoryd/dev/stack.py -> repo root).
DEFAULT_KAFKA_POM = Path(__file__).resolve().parents[2] / "infra" / "kafka" / "pom.xml"


def default_cache_dir() -> Path:
    """$MEMORYD_CACHE_DIR, else ~/.cache/memoryd: survives between runs, unlike state dirs."""
    configured = os.environ.get("MEMORYD_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "memoryd"


# Every port free_port() returned in this process. The port is bound later, by whoever asked,
# and until then the kernel may hand it out again: twice in 2000 calls is the rule, not the
# exception, and two services of one test run must never be given the same port.
_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel picks it), and that no
    earlier call in this process returned.

    Another process may still take it before it is bound: a service start that finds it taken
    raises PortTaken, and its caller can start again on another port.
    """
    with _handed_out_lock:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", 0))
                port: int = sock.getsockname()[1]
            if port not in _handed_out:
                _handed_out.add(port)
                return port


@dataclass(frozen=True)
class DevPorts:
    kafka: int = 19092
    kafka_controller: int = 19093
    postgres: int = 15432
    chroma: int = 18000

    @classmethod
    def free(cls) -> DevPorts:
        """Distinct free ports, for tests running beside a developer's own stack."""
        return cls(*sorted(free_port() for _ in fields(cls)))


class LocalService(Protocol):
    """What LocalKafka, LocalPostgres and LocalChroma have in common."""

    @property
    def home(self) -> Path: ...

    def start(self, timeout: float = ...) -> str: ...

    def stop(self, timeout: float = ...) -> None: ...

    def is_running(self) -> bool: ...


@dataclass(frozen=True)
class DevEndpoints:
    kafka_bootstrap: str
    postgres_dsn: str
    chroma_url: str


class DevStack:
    """Kafka, Postgres and Chroma under state_dir/{kafka,postgres,chroma}."""

    def __init__(
        self,
        state_dir: Path,
        ports: DevPorts | None = None,
        *,
        kafka_pom: Path = DEFAULT_KAFKA_POM,
        jars_cache: Path | None = None,
        for_tests: bool = False,
    ) -> None:
        self.state_dir = state_dir
        self.ports = ports or DevPorts()
        self.kafka = LocalKafka(
            state_dir / "kafka",
            self.ports.kafka,
            self.ports.kafka_controller,
            kafka_pom,
            jars_cache or default_cache_dir() / "kafka-jars",
        )
        self.postgres = LocalPostgres(
            state_dir / "postgres", self.ports.postgres, for_tests=for_tests
        )
        self.chroma = LocalChroma(state_dir / "chroma", self.ports.chroma)

    @property
    def endpoints_file(self) -> Path:
        return self.state_dir / "endpoints.json"

    def up(self) -> DevEndpoints:
        """Start whatever is not running yet; return where the three services listen."""
        kafka, postgres, chroma = self.start([self.kafka, self.postgres, self.chroma])
        endpoints = DevEndpoints(kafka, postgres, chroma)
        tmp = self.endpoints_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(endpoints), indent=2) + "\n", "utf-8")
        tmp.replace(self.endpoints_file)
        return endpoints

    def down(self) -> None:
        """Stop all three (data is kept for the next up()). Idempotent; raises after trying all."""
        try:
            self.stop([self.chroma, self.kafka, self.postgres])
        finally:
            self.endpoints_file.unlink(missing_ok=True)

    def start(self, services: Sequence[LocalService]) -> list[str]:
        """Start those of services not running yet, side by side; return their addresses."""
        for service in services:
            service.home.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(max_workers=3, thread_name_prefix="dev-up") as pool:
            started = [pool.submit(service.start) for service in services]
            # Wait for all before raising so that no start() is still running behind us.
            failures = [f.exception() for f in started]
        errors = [e for e in failures if e is not None]
        if errors:
            # The services that did start stay up; `down()` (memoryd dev down) stops them.
            raise ServiceError(
                "memoryd dev stack failed to start:\n" + "\n\n".join(str(e) for e in errors)
            ) from errors[0]
        return [f.result() for f in started]

    def stop(self, services: Sequence[LocalService]) -> None:
        """Stop services (data is kept). Idempotent; raises after trying all."""
        errors: list[ServiceError] = []
        for service in services:
            try:
                service.stop()
            except ServiceError as exc:
                errors.append(exc)
        if errors:
            raise ServiceError("\n\n".join(str(e) for e in errors)) from errors[0]

    def read_endpoints(self) -> DevEndpoints | None:
        """The endpoints recorded by the last successful up(), if the stack was not downed."""
        try:
            data = json.loads(self.endpoints_file.read_text("utf-8"))
        except FileNotFoundError:
            return None
        return DevEndpoints(**data)
