"""Where a bench finds Kafka, Postgres and Chroma, and the scratch space it makes in them.

Each service comes from, in this order: a command-line option (`--kafka`, `--dsn`,
`--chroma-url`), a `MEMORYD_*` setting (`MEMORYD_KAFKA__BOOTSTRAP_SERVERS`,
`MEMORYD_POSTGRES__DSN`, `MEMORYD_CHROMA__URL` with `MEMORYD_CHROMA__MODE=http`), else the
dev stack's own process for it (`memoryd.dev`), started on free ports in a temporary
directory and stopped at the end. So a bench runs on a fresh machine with no arguments, and
beside a running stack without touching its data: it writes only to a database, topics and
a Chroma collection of its own, named per run and removed afterwards (`--keep` keeps them).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from kafka.admin import KafkaAdminClient
from kafka.errors import UnknownTopicOrPartitionError
from psycopg import sql
from psycopg.conninfo import make_conninfo

from memoryd.dev.chroma import LocalChroma
from memoryd.dev.kafka import LocalKafka
from memoryd.dev.postgres import LocalPostgres
from memoryd.dev.stack import DevPorts, DevStack
from memoryd.settings import ChromaSettings, KafkaSettings, MetricsSettings, Settings
from store.chroma import close_client, http_client
from store.migrate import migrate
from store.postgres import make_pool


@dataclass(frozen=True)
class Endpoints:
    kafka_bootstrap: str  # "" when the bench needs no Kafka
    postgres_dsn: str  # a server DSN: the bench creates its own database in that server
    chroma_url: str
    started: tuple[str, ...]  # the services this run started itself


def add_options(parser: argparse.ArgumentParser, *, kafka: bool) -> None:
    if kafka:
        parser.add_argument("--kafka", help="Kafka bootstrap servers (host:port)")
    parser.add_argument(
        "--dsn", help="Postgres DSN; the bench creates (and drops) a scratch database there"
    )
    parser.add_argument("--chroma-url", help="Chroma server URL (http://host:port)")
    parser.add_argument(
        "--keep", action="store_true", help="keep the scratch database, topics and collection"
    )


def run_id() -> str:
    return uuid.uuid4().hex[:8]


@contextmanager
def endpoints(args: argparse.Namespace, settings: Settings, *, kafka: bool) -> Iterator[Endpoints]:
    """The endpoints from options or settings; what neither names is started here."""
    bootstrap = getattr(args, "kafka", None) or _set(settings.kafka, "bootstrap_servers")
    dsn = args.dsn or _set(settings.postgres, "dsn")
    chroma = args.chroma_url or (settings.chroma.url if settings.chroma.mode == "http" else None)
    missing = [
        name
        for name, value in (
            ("kafka", bootstrap if kafka else ""),
            ("postgres", dsn),
            ("chroma", chroma),
        )
        if value is None
    ]
    if not missing:
        yield Endpoints(bootstrap or "", str(dsn), str(chroma), ())
        return
    state_dir = Path(tempfile.mkdtemp(prefix="memoryd-bench-"))
    stack = DevStack(state_dir, DevPorts.free())
    services: dict[str, LocalKafka | LocalPostgres | LocalChroma] = {
        "kafka": stack.kafka,
        "postgres": stack.postgres,
        "chroma": stack.chroma,
    }
    with ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, state_dir, ignore_errors=True)
        found: dict[str, str] = {}
        for name in missing:
            print(f"starting a local {name} for this run (no option or setting names one)")
            service = services[name]
            service.home.mkdir(parents=True, exist_ok=True)
            cleanup.callback(service.stop)
            found[name] = service.start()
        yield Endpoints(
            bootstrap or found.get("kafka", ""),
            dsn or found["postgres"],
            chroma or found["chroma"],
            tuple(missing),
        )


def _set(model: object, field: str) -> str | None:
    """The value only when it was configured: a default points at no running service."""
    fields_set: set[str] = getattr(model, "model_fields_set", set())
    return str(getattr(model, field)) if field in fields_set else None


@contextmanager
def scratch_database(server_dsn: str, prefix: str, *, keep: bool = False) -> Iterator[str]:
    """A new database on the server of `server_dsn`, migrated; dropped at the end."""
    name = f"{prefix}_{run_id()}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = make_conninfo(server_dsn, dbname=name)
    try:
        pool = make_pool(dsn, max_size=2)
        try:
            migrate(pool)
        finally:
            pool.close()
        yield dsn
    finally:
        if keep:
            print(f"kept database {name}")
        else:
            with psycopg.connect(server_dsn, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )


@contextmanager
def scratch_topics(bootstrap: str, names: list[str], *, keep: bool = False) -> Iterator[None]:
    """Deletes the run's topics at the end (`memoryd.ops.topics.ensure_topics` creates them)."""
    try:
        yield
    finally:
        if not keep:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="memoryd-bench")
            try:
                admin.delete_topics(names)
            except UnknownTopicOrPartitionError:
                pass  # never created: the run failed before publishing
            finally:
                admin.close()


@contextmanager
def scratch_stores(
    ends: Endpoints, name: str, run: str, topics: list[str], *, keep: bool = False
) -> Iterator[tuple[str, str]]:
    """A run's own database, Kafka topics and Chroma collection (bench_<name>...), removed at
    the end unless keep: yields the database's DSN and the collection's name."""
    with (
        scratch_database(ends.postgres_dsn, f"bench_{name}", keep=keep) as dsn,
        scratch_topics(ends.kafka_bootstrap, topics, keep=keep),
        scratch_collection(ends.chroma_url, f"bench_{name}_{run}", keep=keep) as collection,
    ):
        yield dsn, collection


@contextmanager
def scratch_memory(
    base: Settings, ends: Endpoints, name: str, *, keep: bool = False
) -> Iterator[Settings]:
    """A run's own database and Chroma collection (bench_<name>...), removed at the end unless
    keep: yields `base` pointed at them (Chroma over HTTP, no metrics port)."""
    with (
        scratch_database(ends.postgres_dsn, f"bench_{name}", keep=keep) as dsn,
        scratch_collection(ends.chroma_url, f"bench_{name}_{run_id()}", keep=keep) as collection,
    ):
        yield base.model_copy(
            update={
                "postgres": base.postgres.model_copy(update={"dsn": dsn}),
                "chroma": ChromaSettings(mode="http", url=ends.chroma_url, collection=collection),
                "metrics": MetricsSettings(enabled=False),
            }
        )


@contextmanager
def scratch_collection(chroma_url: str, name: str, *, keep: bool = False) -> Iterator[str]:
    try:
        yield name
    finally:
        if not keep:
            # Dropping a collection of a million vectors takes longer than a request usually may.
            client = http_client(chroma_url, timeout_s=600)
            try:
                if any(c.name == name for c in client.list_collections()):
                    client.delete_collection(name)
            finally:
                close_client(client)


def pipeline_settings(base: Settings, ends: Endpoints, dsn: str, topic: str) -> Settings:
    """`base` on these endpoints and database, with a topic (and its dead-letter topic and
    consumer groups) of the run's own; no operations ports, which a bench does not need."""
    return base.model_copy(
        update={
            "kafka": KafkaSettings(
                **{
                    **base.kafka.model_dump(),
                    "bootstrap_servers": ends.kafka_bootstrap,
                    "topic": topic,
                    "dead_letter_topic": f"{topic}.dlq",
                    "log_writer_group": f"{topic}-log",
                    "processor_group": f"{topic}-proc",
                }
            ),
            "postgres": base.postgres.model_copy(update={"dsn": dsn}),
            "metrics": MetricsSettings(enabled=False),
        }
    )
