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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path

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


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
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
        wanted = len(fields(cls))
        ports: set[int] = set()
        while len(ports) < wanted:
            ports.add(free_port())
        return cls(*sorted(ports))


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
        for home in (self.kafka.home, self.postgres.home, self.chroma.home):
            home.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(max_workers=3, thread_name_prefix="dev-up") as pool:
            kafka = pool.submit(self.kafka.start)
            postgres = pool.submit(self.postgres.start)
            chroma = pool.submit(self.chroma.start)
            # Wait for all three before raising so that no start() is still running behind us.
            failures = [f.exception() for f in (kafka, postgres, chroma)]
        errors = [e for e in failures if e is not None]
        if errors:
            # The services that did start stay up; `down()` (memoryd dev down) stops them.
            raise ServiceError(
                "memoryd dev stack failed to start:\n" + "\n\n".join(str(e) for e in errors)
            ) from errors[0]
        endpoints = DevEndpoints(kafka.result(), postgres.result(), chroma.result())
        tmp = self.endpoints_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(endpoints), indent=2) + "\n", "utf-8")
        tmp.replace(self.endpoints_file)
        return endpoints

    def down(self) -> None:
        """Stop all three (data is kept for the next up()). Idempotent; raises after trying all."""
        errors: list[ServiceError] = []
        for service in (self.chroma, self.kafka, self.postgres):
            try:
                service.stop()
            except ServiceError as exc:
                errors.append(exc)
        self.endpoints_file.unlink(missing_ok=True)
        if errors:
            raise ServiceError("\n\n".join(str(e) for e in errors)) from errors[0]

    def read_endpoints(self) -> DevEndpoints | None:
        """The endpoints recorded by the last successful up(), if the stack was not downed."""
        try:
            data = json.loads(self.endpoints_file.read_text("utf-8"))
        except FileNotFoundError:
            return None
        return DevEndpoints(**data)
