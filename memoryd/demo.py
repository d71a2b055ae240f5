"""The main job end to end: local services, the sample stream, both consumers, the result."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import closing, contextmanager
from importlib import resources
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from domain.ids import MemoryKey
from memoryd import wiring
from memoryd.dev.stack import DevPorts, DevStack, LocalService
from memoryd.ops.topics import ensure_topics
from memoryd.sample_stream import read_jsonl
from memoryd.settings import Settings
from producers.contract import ContextEvent
from store.migrate import migrate
from store.postgres import make_pool

SAMPLE_QUERIES = {
    "default": "What is the user working on right now?",
}


def sample_file() -> Path:
    return Path(str(resources.files("memoryd") / "data" / "sample_events.jsonl"))


@contextmanager
def _local_services(settings: Settings, keep_services: bool) -> Iterator[Settings]:
    """settings pointed at the local services, started if need be; then stopped again."""
    d = settings.dev
    stack = DevStack(
        d.state_dir, DevPorts(d.kafka_port, d.kafka_controller_port, d.postgres_port, d.chroma_port)
    )
    # An address set in the settings (environment or file) names a service the user runs: it is
    # used as given, and the local one is not started.
    wanted: dict[str, LocalService] = {}
    if "bootstrap_servers" not in settings.kafka.model_fields_set:
        wanted["kafka"] = stack.kafka
    if "dsn" not in settings.postgres.model_fields_set:
        wanted["postgres"] = stack.postgres
    # Embedded Chroma (the default) needs no server.
    if settings.chroma.mode == "http" and "url" not in settings.chroma.model_fields_set:
        wanted["chroma"] = stack.chroma
    # A service already running (`memoryd dev up`, an earlier --keep-services) is used and left
    # running: whoever started it may still need it.
    ours = [service for service in wanted.values() if not service.is_running()]
    try:
        addresses = dict(zip(wanted, stack.start(list(wanted.values())), strict=True))
        pointed = _point_at(settings, addresses)
        kafka = _shown(pointed.kafka.bootstrap_servers, "kafka" in addresses)
        postgres = _shown(_without_password(pointed.postgres.dsn), "postgres" in addresses)
        chroma = (
            f"embedded at {pointed.chroma.path}"
            if pointed.chroma.mode == "embedded"
            else _shown(pointed.chroma.url, "chroma" in addresses)
        )
        print(f"kafka {kafka} · postgres {postgres} · chroma {chroma}")
        yield pointed
    finally:
        if not keep_services:
            stack.stop(ours)


def _point_at(settings: Settings, addresses: Mapping[str, str]) -> Settings:
    kafka, postgres, chroma = settings.kafka, settings.postgres, settings.chroma
    if "kafka" in addresses:
        kafka = kafka.model_copy(update={"bootstrap_servers": addresses["kafka"]})
    if "postgres" in addresses:
        postgres = postgres.model_copy(update={"dsn": addresses["postgres"]})
    if "chroma" in addresses:
        chroma = chroma.model_copy(update={"url": addresses["chroma"]})
    return settings.model_copy(update={"kafka": kafka, "postgres": postgres, "chroma": chroma})


def _shown(address: str, local: bool) -> str:
    return address if local else f"{address} (from the settings)"


def _without_password(dsn: str) -> str:
    # A DSN from the settings may carry a password, which has no business on a terminal.
    parts = conninfo_to_dict(dsn)
    if parts.pop("password", None) is None:
        return dsn
    return make_conninfo(**{k: str(v) for k, v in parts.items()})


def run_demo(settings: Settings, keep_services: bool = False) -> int:
    started = time.monotonic()
    with _local_services(settings, keep_services) as pointed:
        return _run(pointed, started)


def _run(settings: Settings, started: float) -> int:
    pool = make_pool(settings.postgres.dsn, max_size=2)
    try:
        migrate(pool)
    finally:
        pool.close()
    ensure_topics(settings)
    events = [ContextEvent.from_bytes(raw) for _, raw in read_jsonl(sample_file())]
    with closing(wiring.publisher(settings)) as pub:
        pub.publish(events)
    print(f"published {len(events)} sample events for {len({e.user_id for e in events})} users")
    with wiring.core(settings) as c:
        writer = wiring.log_writer(c)
        writer_thread = threading.Thread(target=writer.drain, kwargs={"idle_s": 3.0}, daemon=True)
        writer_thread.start()
        wiring.processor(c).run_until_idle(idle_s=3.0)
        writer_thread.join(timeout=120)
        pending = c.events.unconsolidated()
        if pending:
            print(f"ERROR: {len(pending)} logged event(s) were not consolidated")
            return 1
        print(
            f"all {c.events.count()} logged events consolidated "
            f"in {time.monotonic() - started:.1f}s\n"
        )
        _print_users(c, sorted({MemoryKey(e.organization_id, e.user_id) for e in events}))
    return 0


def _print_users(c: wiring.Core, memories: list[MemoryKey]) -> None:
    # The read path's background writers (audit rows, recall counters) must finish before the
    # core closes its pool, or what they hold is dropped.
    with wiring.read_path(c) as service:
        for key in memories:
            state = c.memory.load_state(key)
            facts = c.memory.facts(key)
            print(f"══ {key} (memory version {state.version}, {len(facts)} active facts)")
            print("W:", state.working_memory)
            print("S:", json.dumps(state.scaffold, ensure_ascii=False, sort_keys=True)[:1200])
            query = SAMPLE_QUERIES["default"]
            bundle = service.assemble(key, query)
            top = bundle.facts[0] if bundle.facts else None
            shown = f"{top.fact.content} (similarity {top.similarity:.2f})" if top else "(none)"
            print(f"retrieval for {query!r}: {shown}  [{bundle.latency_ms:.1f} ms]\n")
