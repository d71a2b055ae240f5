"""Shared fixtures: real Kafka, Postgres and Chroma for integration tests, never fakes.

Each service is found in this order:
  1. an existing one named by MEMORYD_TEST_KAFKA_BOOTSTRAP / MEMORYD_TEST_POSTGRES_DSN /
     MEMORYD_TEST_CHROMA_URL (e.g. the stack of `memoryd dev up`);
  2. a testcontainers container, when a Docker engine answers, of an image pinned to an exact
     version below (the same as infra/compose.yaml's; Kafka's that of infra/kafka/pom.xml,
     Chroma's that of the chromadb wheel), so a run never pulls a tag that has moved;
  3. a local process from memoryd.dev (no Docker needed) on free ports (started again on new
     ones if another process takes one first: tests.support.services), its state in a pytest
     temp dir (Postgres: a /tmp dir of its own, see _postgres_home), stopped at session end,
     and by a watchdog of its own if the session dies without a teardown (stop_on_exit).

A SIGTERM ends the run as Ctrl-C does, with the fixtures torn down (see pytest_configure).

Fixtures: kafka_bootstrap, postgres_dsn, chroma_url (session-scoped service addresses);
kafka_admin, kafka_topic_factory (unique topics, deleted afterwards); fresh_database (a database
per test, dropped afterwards); postgres_home (a directory a LocalPostgres can run in).

The service fixtures are lazy: a test that does not ask for one starts nothing, so pure unit
tests never pay for a JVM. The Kafka jars are cached in $MEMORYD_CACHE_DIR (default
~/.cache/memoryd); `make bootstrap` (`memoryd dev fetch`) fills that cache before pytest runs,
as a first download inside the broker fixture could outlast the per-test timeout.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    # So that `memoryd` imports from this checkout even when the package is not installed.
    sys.path.insert(0, str(REPO_ROOT))

with warnings.catch_warnings():
    # kafka-python 3.0.12 reads its protocol schemas with importlib.resources.read_text/open_text,
    # deprecated on Python 3.11/3.12. Importing it once here, before any test module, keeps that
    # third-party warning from failing collection under -W error / filterwarnings = error.
    warnings.filterwarnings("ignore", r"(read|open)_text is deprecated", DeprecationWarning)
    from kafka import KafkaAdminClient

# Below the sys.path fix on purpose (hence E402), so the checkout's memoryd is the one imported.
import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402
from psycopg.conninfo import make_conninfo  # noqa: E402

from memoryd.dev import DevPorts, LocalChroma, LocalKafka, LocalPostgres, free_port  # noqa: E402
from memoryd.dev.chroma import heartbeat  # noqa: E402
from memoryd.dev.kafka import kafka_ready  # noqa: E402
from memoryd.dev.stack import default_cache_dir  # noqa: E402
from tests.support.services import running  # noqa: E402

KAFKA_IMAGE = "apache/kafka:4.1.1"
POSTGRES_IMAGE = "postgres:16.13"
CHROMA_IMAGE = "chromadb/chroma:1.5.9"
STARTUP_TIMEOUT_S = 180.0


def _interrupt(_signum: int, _frame: object) -> None:
    # A second SIGTERM ends the run on the spot; the services' watchdogs still stop them.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise KeyboardInterrupt


def pytest_configure(config: pytest.Config) -> None:
    # SIGTERM (a cancelled CI job, `timeout`) would end the run without any teardown. As a
    # KeyboardInterrupt it stops the session's services and removes their directories first.
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)
    config.addinivalue_line(
        "markers", "integration: talks to real Kafka, Postgres or Chroma started by the fixtures"
    )
    config.addinivalue_line(
        "markers", "faults: injects a fault into a running pipeline (its own CI stage)"
    )


# --- where a service comes from -----------------------------------------------------------------


@functools.cache
def docker_available() -> bool:
    """Cheap first (is any engine configured?), then a ping with a short timeout."""
    if not (os.environ.get("DOCKER_HOST") or Path("/var/run/docker.sock").exists()):
        return False
    # Lazy: only worth importing when an engine may exist.
    import docker  # type: ignore[import-untyped,unused-ignore]  # noqa: PLC0415

    try:
        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (docker.errors.DockerException, OSError):  # requests' errors are OSErrors
        return False


def _provide(
    env_var: str,
    container: Callable[[], AbstractContextManager[str]],
    local: Callable[[], AbstractContextManager[str]],
) -> AbstractContextManager[str]:
    existing = os.environ.get(env_var)
    if existing:
        return nullcontext(existing)
    return container() if docker_available() else local()


def _wait_for(what: str, ready: Callable[[], bool], timeout: float = STARTUP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready after {timeout:.0f}s")
        time.sleep(0.5)


@contextmanager
def _started(container: Any) -> Iterator[Any]:
    try:
        # testcontainers emits DeprecationWarnings of its own (legacy wait helpers); they are
        # not ours to fix and must not fail a run under -W error.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            container.start()
        yield container
    finally:
        container.stop()  # also removes a container whose start() failed half-way


# --- Kafka ----------------------------------------------------------------------------------------


@contextmanager
def _kafka_container() -> Iterator[str]:
    from testcontainers.core.container import DockerContainer  # noqa: PLC0415  (Docker only)

    port = free_port()
    container = DockerContainer(KAFKA_IMAGE).with_bind_ports(9092, port)
    host = container.get_docker_client().host()
    # The client listener is advertised as the host-side address; the broker reaches itself
    # on a separate in-container listener, as port mappings are invisible from inside.
    for key, value in {
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": "PLAINTEXT://0.0.0.0:9092,BROKER://0.0.0.0:9094,"
        "CONTROLLER://0.0.0.0:9093",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://{host}:{port},BROKER://localhost:9094",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "PLAINTEXT:PLAINTEXT,BROKER:PLAINTEXT,"
        "CONTROLLER:PLAINTEXT",
        "KAFKA_INTER_BROKER_LISTENER_NAME": "BROKER",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
        "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false",
        "KAFKA_NUM_PARTITIONS": "1",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
        "KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS": "1000",
    }.items():
        container.with_env(key, value)
    with _started(container):
        bootstrap = f"{host}:{port}"
        _wait_for(f"Kafka container at {bootstrap}", lambda: kafka_ready(bootstrap))
        yield bootstrap


def _local_kafka(home: Path) -> AbstractContextManager[str]:
    def kafka() -> LocalKafka:
        ports = DevPorts.free()  # two distinct ports: client and controller listeners
        return LocalKafka(
            home,
            ports.kafka,
            ports.kafka_controller,
            pom=REPO_ROOT / "infra" / "kafka" / "pom.xml",
            jars_cache=default_cache_dir() / "kafka-jars",
            stop_on_exit=True,
        )

    return running(kafka, STARTUP_TIMEOUT_S)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """host:port of a KRaft broker with auto topic creation off."""
    with _provide(
        "MEMORYD_TEST_KAFKA_BOOTSTRAP",
        _kafka_container,
        lambda: _local_kafka(tmp_path_factory.mktemp("kafka")),
    ) as bootstrap:
        yield bootstrap


@pytest.fixture
def kafka_admin(kafka_bootstrap: str) -> Iterator[KafkaAdminClient]:
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="memoryd-tests")
    try:
        yield admin
    finally:
        admin.close()


@pytest.fixture
def kafka_topic_factory(kafka_admin: KafkaAdminClient) -> Iterator[Callable[..., str]]:
    """Call it as make_topic(partitions=1) to get a new, uniquely named, empty topic."""
    created: list[str] = []

    def make_topic(partitions: int = 1, prefix: str = "test") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        # wait_for_metadata: the topic has a leader everywhere before the test produces to it.
        kafka_admin.create_topics(
            {name: {"num_partitions": partitions, "replication_factor": 1}},
            wait_for_metadata=True,
        )
        created.append(name)
        return name

    yield make_topic
    if created:
        kafka_admin.delete_topics(created)


# --- Postgres -------------------------------------------------------------------------------------


@contextmanager
def _postgres_container() -> Iterator[str]:
    from testcontainers.community.postgres import PostgresContainer  # noqa: PLC0415

    container = PostgresContainer(
        POSTGRES_IMAGE, username="postgres", password="postgres", dbname="memoryd", driver=None
    )
    with _started(container):
        yield container.get_connection_url()


@contextmanager
def _postgres_home() -> Iterator[Path]:
    """A fresh directory for a LocalPostgres cluster, removed afterwards.

    Not under pytest's tmp_path: as root, Postgres runs as an unprivileged user who must be able
    to traverse to its data dir, and pytest keeps /tmp/pytest-of-root at mode 0700 (re-applied
    by every pytest session that starts, even one running in parallel mid-initdb).
    """
    home = Path(tempfile.mkdtemp(prefix="memoryd-test-pg-"))
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


@contextmanager
def _local_postgres() -> Iterator[str]:
    with (
        _postgres_home() as home,
        running(
            lambda: LocalPostgres(home, free_port(), for_tests=True, stop_on_exit=True),
            STARTUP_TIMEOUT_S,
        ) as dsn,
    ):
        yield dsn


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """libpq DSN of the session's `memoryd` database (shared: prefer fresh_database)."""
    with _provide(
        "MEMORYD_TEST_POSTGRES_DSN",
        _postgres_container,
        _local_postgres,
    ) as dsn:
        yield dsn


@pytest.fixture
def postgres_home() -> Iterator[Path]:
    """A directory to run a LocalPostgres in (use instead of tmp_path, see _postgres_home)."""
    with _postgres_home() as home:
        yield home


def _with_dbname(dsn: str, dbname: str) -> str:
    if dsn.startswith(("postgresql://", "postgres://")):
        return urlunsplit(urlsplit(dsn)._replace(path=f"/{dbname}"))
    return make_conninfo(dsn, dbname=dbname)


@pytest.fixture
def fresh_database(postgres_dsn: str) -> Iterator[str]:
    """DSN of a new, empty database for this test only; dropped afterwards."""
    name = f"test_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield _with_dbname(postgres_dsn, name)
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        # FORCE: a connection the test leaked must not keep its database alive.
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


# --- Chroma ---------------------------------------------------------------------------------------


@contextmanager
def _chroma_container() -> Iterator[str]:
    from testcontainers.core.container import DockerContainer  # noqa: PLC0415  (Docker only)

    container = DockerContainer(CHROMA_IMAGE).with_exposed_ports(8000)
    with _started(container):
        url = f"http://{container.get_container_host_ip()}:{container.get_exposed_port(8000)}"
        _wait_for(f"Chroma container at {url}", lambda: heartbeat(url))
        yield url


def _local_chroma(home: Path) -> AbstractContextManager[str]:
    return running(lambda: LocalChroma(home, free_port(), stop_on_exit=True), STARTUP_TIMEOUT_S)


@pytest.fixture(scope="session")
def chroma_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL (http://host:port) of a Chroma server."""
    with _provide(
        "MEMORYD_TEST_CHROMA_URL",
        _chroma_container,
        lambda: _local_chroma(tmp_path_factory.mktemp("chroma")),
    ) as url:
        yield url
