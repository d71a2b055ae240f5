"""Load: events from a producer through the whole pipeline, run as the real processes.

    python -m bench.load [--events 100000] [--users 1000] [--json-out FILE]
        [--deadline-s 3600] [services options]

`memoryd log-writer` and `memoryd processor` (offline backend) run as child processes, as
deployed; one `KafkaEventPublisher` publishes `--events` events over `--users` users in
batches of 1,000. The run ends when every event is consolidated and every fact indexed in
Chroma; then the processes stop (SIGTERM) and the invariant checker
(`memoryd.analyst.invariants`) counts what was lost or doubled. Reported: wall time, events/s
of each stage from the first publish (published, logged, consolidated, indexed), and the peak
RSS (VmHWM) of each process. Exit status 1 when an invariant does not hold.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from bench import services
from bench.ingest import make_events
from bench.locomo.metrics import markdown_table
from domain.ids import MemoryKey
from memoryd import wiring
from memoryd.analyst.invariants import InvariantReport, check_deployment
from memoryd.ops.topics import ensure_topics
from memoryd.settings import ChromaSettings, Settings
from producers.contract import ContextEvent
from store.postgres import make_pool

PUBLISH_BATCH = 1_000
PROCESSES = ("log-writer", "processor")
STOP_TIMEOUT_S = 120.0
_COUNTS = {
    "logged": "SELECT count(*) FROM context_events",
    "consolidated": "SELECT count(*) FROM consolidated_events",
    "pending_index": "SELECT count(*) FROM memory_facts WHERE indexed_at IS NULL",
}


@dataclass
class LoadResult:
    events: int
    users: int
    seconds: dict[str, float] = field(default_factory=dict)  # stage → seconds from t0
    peak_rss_mib: dict[str, float] = field(default_factory=dict)
    exit_codes: dict[str, int | None] = field(default_factory=dict)
    invariants: dict[str, Any] = field(default_factory=dict)
    # Where the counts stood when the run ended: all events everywhere, unless the deadline
    # came first (then the invariants count the events still in flight as unaccounted).
    reached: dict[str, int] = field(default_factory=dict)
    completed: bool = False
    load_average: tuple[float, float, float] = (0.0, 0.0, 0.0)

    @property
    def events_per_s(self) -> dict[str, float]:
        return {stage: self.events / s for stage, s in self.seconds.items() if s > 0}

    def as_json(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "users": self.users,
            "seconds": self.seconds,
            "events_per_s": self.events_per_s,
            "peak_rss_mib": self.peak_rss_mib,
            "exit_codes": self.exit_codes,
            "invariants": self.invariants,
            "reached": self.reached,
            "completed": self.completed,
            "load_average": self.load_average,
        }


def process_env(settings: Settings) -> dict[str, str]:
    """The environment that makes a `memoryd` process use these settings."""
    k, c = settings.kafka, settings.chroma
    env = {
        "MEMORYD_KAFKA__BOOTSTRAP_SERVERS": k.bootstrap_servers,
        "MEMORYD_KAFKA__TOPIC": k.topic,
        "MEMORYD_KAFKA__DEAD_LETTER_TOPIC": k.dead_letter_topic,
        "MEMORYD_KAFKA__LOG_WRITER_GROUP": k.log_writer_group,
        "MEMORYD_KAFKA__PROCESSOR_GROUP": k.processor_group,
        "MEMORYD_POSTGRES__DSN": settings.postgres.dsn,
        "MEMORYD_CHROMA__MODE": c.mode,
        "MEMORYD_CHROMA__PATH": str(c.path),
        "MEMORYD_CHROMA__URL": c.url,
        "MEMORYD_CHROMA__COLLECTION": c.collection,
        "MEMORYD_LLM__BACKEND": "offline",
        "MEMORYD_PROCESSOR__MAX_BATCH": str(settings.processor.max_batch),
        "MEMORYD_PROCESSOR__MAX_WAIT_S": str(settings.processor.max_wait_s),
        "MEMORYD_PROCESSOR__CONCURRENCY": str(settings.processor.concurrency),
        "MEMORYD_METRICS__ENABLED": "false",
    }
    return {**os.environ, **env}


def peak_rss_mib(pid: int) -> float:
    """The process's high-water mark of resident memory (VmHWM), while it still runs."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


class Counts:
    def __init__(self, dsn: str) -> None:
        self._pool = make_pool(dsn, max_size=1, name="memoryd-load")

    def read(self) -> dict[str, int]:
        with self._pool.connection() as conn:
            return {k: int(conn.execute(q).fetchone()[0]) for k, q in _COUNTS.items()}  # type: ignore[index]

    def close(self) -> None:
        self._pool.close()


def run_load(
    settings: Settings,
    events: Sequence[ContextEvent],
    users: int,
    logs: Path,
    deadline_s: float = 3600.0,
    say: Callable[[str], None] = print,
) -> LoadResult:
    """Publish `events`, run both processes until all is consolidated and indexed, stop them,
    check the invariants. The topics must be new and the database migrated and empty."""
    ensure_topics(settings)
    result = LoadResult(len(events), users)
    env = process_env(settings)
    children: dict[str, subprocess.Popen[bytes]] = {}
    outputs: list[IO[bytes]] = []
    counts = Counts(settings.postgres.dsn)
    try:
        for name in PROCESSES:
            out = (logs / f"{name}.log").open("wb")
            outputs.append(out)
            children[name] = subprocess.Popen(
                [sys.executable, "-m", "memoryd.cli", name], env=env, stdout=out, stderr=out
            )
        started = time.perf_counter()
        publisher = wiring.publisher(settings)
        try:
            for i in range(0, len(events), PUBLISH_BATCH):
                publisher.publish(events[i : i + PUBLISH_BATCH])
        finally:
            publisher.close()
        result.seconds["published"] = time.perf_counter() - started
        say(f"published {len(events)} events in {result.seconds['published']:.1f} s")
        try:
            _wait(result, counts, children, started, started + deadline_s, say)
        except RuntimeError:
            for name in PROCESSES:
                tail = (logs / f"{name}.log").read_text(errors="replace").splitlines()[-20:]
                say(f"--- the last lines of {name}:\n" + "\n".join(tail))
            raise
        for name, child in children.items():
            result.peak_rss_mib[name] = peak_rss_mib(child.pid)
    finally:
        for child in children.values():
            child.send_signal(signal.SIGTERM)
        for name, child in children.items():
            try:
                result.exit_codes[name] = child.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                child.kill()
                result.exit_codes[name] = child.wait()
        for log in outputs:
            log.close()
        counts.close()
    result.peak_rss_mib["driver"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result.load_average = os.getloadavg()
    say(f"{result.seconds}, peak RSS {result.peak_rss_mib} MiB, load {result.load_average}")
    report = check_deployment(settings, _expected(events))
    result.invariants = _invariants(report)
    say(report.summary())
    return result


def _wait(
    result: LoadResult,
    counts: Counts,
    children: Mapping[str, subprocess.Popen[bytes]],
    started: float,
    deadline: float,
    say: Callable[[str], None],
) -> None:
    """Until every event is logged, consolidated and its facts indexed, or the deadline: when
    each stage got there."""
    n, last_said = result.events, 0.0
    while True:
        now = time.perf_counter()
        seen = counts.read()
        for stage in ("logged", "consolidated"):
            if stage not in result.seconds and seen[stage] >= n:
                result.seconds[stage] = now - started
        result.reached = seen
        if "consolidated" in result.seconds and seen["pending_index"] == 0:
            result.seconds["indexed"] = now - started
            result.completed = True
            return
        dead = {name: c.returncode for name, c in children.items() if c.poll() is not None}
        if dead:
            raise RuntimeError(f"a process stopped during the run: {dead}")
        if now > deadline:
            say(f"not done by the deadline: {seen} of {n} events; stopping")
            result.seconds["deadline"] = now - started
            return
        if now - last_said >= 15:
            say(f"{now - started:.0f} s: {seen}")
            last_said = now
        time.sleep(0.5)


def _expected(events: Sequence[ContextEvent]) -> dict[MemoryKey, list[uuid.UUID]]:
    out: dict[MemoryKey, list[uuid.UUID]] = defaultdict(list)
    for e in events:
        out[MemoryKey(e.organization_id, e.user_id)].append(e.event_id)
    return out


def _invariants(report: InvariantReport) -> dict[str, Any]:
    return {
        "hold": report.ok,
        "violations": report.violations(),
        "expected": report.expected,
        "logged": report.logged,
        "consolidated": report.consolidated,
        "dead_lettered": report.dead_lettered,
        "memories": report.memories,
    }


def _settings(base: Settings, ends: services.Endpoints, dsn: str, run: str) -> Settings:
    topic = f"bench-load-{run}"
    settings = services.pipeline_settings(base, ends, dsn, topic)
    chroma = ChromaSettings(mode="http", url=ends.chroma_url, collection=topic)
    return settings.model_copy(update={"chroma": chroma})


def table(result: LoadResult) -> str:
    rows = [(stage, f"{s:.1f}", f"{result.events / s:.0f}") for stage, s in result.seconds.items()]
    return markdown_table(["stage (from the first publish)", "seconds", "events/s"], rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--users", type=int, default=1_000)
    parser.add_argument("--deadline-s", type=float, default=3600.0)
    parser.add_argument("--json-out", type=Path)
    services.add_options(parser, kafka=True)
    args = parser.parse_args(argv)
    base = Settings()
    run = services.run_id()
    events = make_events(args.events, args.users, f"load-{run}")
    with (
        services.endpoints(args, base, kafka=True) as ends,
        services.scratch_database(ends.postgres_dsn, "bench_load", keep=args.keep) as dsn,
        tempfile.TemporaryDirectory(prefix="memoryd-load-") as logs,
    ):
        settings = _settings(base, ends, dsn, run)
        k = settings.kafka
        with (
            services.scratch_topics(
                ends.kafka_bootstrap, [k.topic, k.dead_letter_topic], keep=args.keep
            ),
            services.scratch_collection(
                ends.chroma_url, settings.chroma.collection, keep=args.keep
            ),
        ):
            result = run_load(settings, events, args.users, Path(logs), args.deadline_s)
    print(table(result))
    print(f"peak RSS (MiB): {result.peak_rss_mib}; load average: {result.load_average}")
    if args.json_out:
        args.json_out.write_text(json.dumps(result.as_json(), indent=2) + "\n")
    return 0 if result.completed and result.invariants["hold"] else 1


if __name__ == "__main__":
    sys.exit(main())
