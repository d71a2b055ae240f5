"""Ingest: events from producers through Kafka into the Postgres log, and consolidation.

    python -m bench.ingest [--events 100000] [--users 1000] [--producers 4] [--writers 2]
        [--rate 1000] [--rate-seconds 10] [--consolidate 2000] [--warm-up 20000]
        [--json-out FILE] [services options]

Four measures, each on a topic of its own (`--events 0`, `--rate 0`, `--consolidate 0` leave
one out), after a warm-up: `--warm-up` events through the throughput measure's path on a
topic of their own, not reported (a broker just started is slower for its first seconds).

1. throughput: `--events` events over `--users` users published by `--producers` processes
   (one `KafkaEventPublisher` each, batches of 1,000) while `--writers` processes (one
   `LogWriter` each, as `memoryd log-writer` runs it, in one group) consume them; events/s
   from the first publish to the last event in `context_events`, and the CPU time each side
   spent per event;
2. drain: the same events already on the topic when the writers start, so Kafka -> Postgres
   alone: events/s from the first row logged to the last;
3. latency: `--rate` events/s for `--rate-seconds`, published every 10 ms; producer-to-log
   time is `recorded_at` (Postgres, at insert) minus `occurred_at` (set just before publish);
4. consolidation: `--consolidate` events (20 per user, one batch each) through the
   MemoryProcessor with the offline backend, to every event consolidated and every fact
   indexed; events/s over that time.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from bench import ingest_workers, services
from bench.locomo.metrics import markdown_table
from memoryd import wiring
from memoryd.ops.topics import ensure_topics
from memoryd.settings import ChromaSettings, Settings
from producers.contract import ContextEvent, EventType, Source, SourceMetadata

ORGANIZATION = "bench-org"
TICK_S = 0.01
FACTS = [
    "I moved to {city} last spring and bike to work",
    "My manager {name} wants weekly notes on the launch",
    "I prefer short answers with code examples",
    "I am planning a trip to {city} with {name} in June",
    "I keep the incident notes for billing in Notion",
]
CITIES = ["Lisbon", "Kyoto", "Oslo", "Lima", "Pune", "Accra", "Turin", "Quito"]
NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Farah", "Goran", "Hana"]


def make_events(count: int, users: int, seed: str, first: int = 0) -> list[ContextEvent]:
    now = datetime.now(UTC)
    return [
        ContextEvent(
            event_id=uuid.uuid5(uuid.NAMESPACE_URL, f"bench-ingest/{seed}/{i}"),
            user_id=f"ingest-user-{i % users:05d}",
            organization_id=ORGANIZATION,
            event_type=EventType.FACT,
            content=FACTS[i % len(FACTS)].format(
                city=CITIES[i % len(CITIES)], name=NAMES[(i // users) % len(NAMES)]
            )
            + f" (turn {i // users})",
            source_metadata=SourceMetadata(source=Source.INTERACTIVE, message_id=f"m-{i}"),
            occurred_at=now,
        )
        for i in range(first, first + count)
    ]


@dataclass(frozen=True)
class EventMaker:
    """`make_events` for one producer process's slice (picklable, unlike a closure)."""

    users: int
    seed: str

    def __call__(self, first: int, count: int) -> list[ContextEvent]:
        return make_events(count, self.users, self.seed, first)


def _settings(base: Settings, ends: services.Endpoints, dsn: str, run: str, phase: str) -> Settings:
    return services.pipeline_settings(base, ends, dsn, f"bench-ingest-{run}-{phase}")


def _logged(c: wiring.Core, prefix: str) -> int:
    with c.pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) FROM context_events WHERE kafka_topic = %s", (prefix,)
        ).fetchone()
    return 0 if row is None else int(row[0])


class _Writer:
    """A log writer running in a thread until stopped."""

    def __init__(self, c: wiring.Core) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=wiring.log_writer(c).run, args=(self._stop,), name="bench-log-writer"
        )

    def __enter__(self) -> _Writer:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def _wait_logged(c: wiring.Core, topic: str, expected: int, timeout_s: float) -> float:
    deadline = time.perf_counter() + timeout_s
    while (n := _logged(c, topic)) < expected:
        if time.perf_counter() > deadline:
            raise SystemExit(f"only {n} of {expected} events reached the log in {timeout_s} s")
        time.sleep(0.05)
    return time.perf_counter()


class _Progress:
    """Polls the log's row count: when the first row of the topic came, and the last."""

    def __init__(self, c: wiring.Core, topic: str) -> None:
        self._c, self._topic = c, topic

    def wait_all(self, expected: int, timeout_s: float) -> tuple[float, int, float]:
        """(when rows first appeared, how many were there then, when all were there)."""
        deadline = time.monotonic() + timeout_s
        first: tuple[float, int] | None = None
        while (n := _logged(self._c, self._topic)) < expected:
            if time.monotonic() > deadline:
                raise SystemExit(f"only {n} of {expected} events reached the log in {timeout_s} s")
            if first is None and n > 0:
                first = (time.monotonic(), n)
            time.sleep(0.02)
        done = time.monotonic()
        return (*(first or (done, n)), done)


def _cpu_us(cpu_s: Sequence[float], events: int) -> float:
    return 1e6 * sum(cpu_s) / events


def throughput(
    settings: Settings, total: int, users: int, producers: int, writers: int, seed: str = "log"
) -> dict[str, float]:
    """Producers and writers at once: events/s from the first publish to the last row."""
    ensure_topics(settings)
    with wiring.core(settings) as c, ingest_workers.writers(settings, writers) as w:
        sent = ingest_workers.publish(settings, EventMaker(users, seed), total, producers)
        _, _, done = _Progress(c, settings.kafka.topic).wait_all(total, 900)
    started = min(p.started for p in sent)
    return {
        "events": total,
        "producers": producers,
        "writers": writers,
        "publish_events_per_s": total / (max(p.finished for p in sent) - started),
        "log_events_per_s": total / (done - started),
        "producer_cpu_us_per_event": _cpu_us([p.cpu_s for p in sent], total),
        "writer_cpu_us_per_event": _cpu_us(w.cpu_s, total),
    }


def drain(
    settings: Settings, total: int, users: int, producers: int, writers: int
) -> dict[str, float]:
    """Kafka -> Postgres alone: the events wait on the topic, then the writers start."""
    ensure_topics(settings)
    ingest_workers.publish(settings, EventMaker(users, "drain"), total, producers)
    with wiring.core(settings) as c, ingest_workers.writers(settings, writers) as w:
        first, before, done = _Progress(c, settings.kafka.topic).wait_all(total, 900)
    return {
        "events": total,
        "writers": writers,
        **drain_rate(total, before, done - first),
        "writer_cpu_us_per_event": _cpu_us(w.cpu_s, total),
    }


def drain_rate(total: int, before: int, seconds: float) -> dict[str, float]:
    """The drain's events/s over the rows logged after its first look (`before` were there
    already: the writers start writing while their group settles). With none left after it
    there is nothing to time: no rate (the table says so), not 0 events/s."""
    timed = total - before
    if timed <= 0:
        return {"timed_events": 0}
    return {"timed_events": timed, "log_events_per_s": timed / max(seconds, 1e-9)}


def latency(settings: Settings, rate: int, seconds: float) -> dict[str, float]:
    ensure_topics(settings)
    per_tick = max(1, round(rate * TICK_S))
    ticks = int(seconds / TICK_S)
    sent = 0
    with wiring.core(settings) as c, _Writer(c):
        publisher = wiring.publisher(settings)
        try:
            time.sleep(3.0)  # the writer joins its group before the clock starts
            began = time.perf_counter()
            for tick in range(ticks):
                batch = make_events(per_tick, 100, f"rate-{tick}")
                publisher.publish(batch)
                sent += len(batch)
                pause = began + (tick + 1) * TICK_S - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
            elapsed = time.perf_counter() - began
        finally:
            publisher.close()
        _wait_logged(c, settings.kafka.topic, sent, 120)
        with c.pool.connection() as conn:
            rows = conn.execute(
                "SELECT extract(epoch FROM recorded_at - occurred_at) * 1000"
                " FROM context_events WHERE kafka_topic = %s",
                (settings.kafka.topic,),
            ).fetchall()
    ms = [float(r[0]) for r in rows]
    p50, p99 = np.percentile(ms, [50, 99])
    return {"events": sent, "offered_per_s": sent / elapsed, "p50_ms": p50, "p99_ms": p99}


def consolidation(settings: Settings, events: Sequence[ContextEvent]) -> dict[str, float]:
    ensure_topics(settings)
    publisher = wiring.publisher(settings)
    try:
        publisher.publish(events)
    finally:
        publisher.close()
    with wiring.core(settings) as c:
        started = time.perf_counter()
        wiring.processor(c).run_until_idle(idle_s=3.0, deadline_s=1800)
        wiring.indexer(c).drain_pending()
        # run_until_idle stops once it has read and consolidated every event there was (a
        # tenth of a second of quiet after that, counted here; idle_s only if it cannot tell).
        elapsed = time.perf_counter() - started
        with c.pool.connection() as conn:
            row = conn.execute("SELECT count(*) FROM consolidated_events").fetchone()
    consolidated = 0 if row is None else int(row[0])
    if consolidated != len(events):
        raise SystemExit(f"{consolidated} of {len(events)} events consolidated")
    return {"events": len(events), "events_per_s": len(events) / elapsed}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--users", type=int, default=1_000)
    parser.add_argument("--rate", type=int, default=1_000, help="events/s for the latency")
    parser.add_argument("--rate-seconds", type=float, default=10.0)
    parser.add_argument("--consolidate", type=int, default=2_000, help="0: not measured")
    parser.add_argument("--producers", type=int, default=4, help="producer processes")
    parser.add_argument("--writers", type=int, default=2, help="log-writer processes")
    parser.add_argument(
        "--warm-up", type=int, default=20_000, help="events through the pipeline, unmeasured"
    )
    parser.add_argument("--json-out", type=Path)
    services.add_options(parser, kafka=True)
    args = parser.parse_args(argv)
    base = Settings()
    results: dict[str, dict[str, float]] = {}
    with services.endpoints(args, base, kafka=True) as ends:
        run = services.run_id()
        phases = ("warm", "log", "drain", "rate", "cons")
        topics = [f"bench-ingest-{run}-{p}{s}" for p in phases for s in ("", ".dlq")]
        with (
            services.scratch_database(ends.postgres_dsn, "bench_ingest", keep=args.keep) as dsn,
            services.scratch_topics(ends.kafka_bootstrap, topics, keep=args.keep),
            services.scratch_collection(
                ends.chroma_url, f"bench_ingest_{run}", keep=args.keep
            ) as collection,
        ):
            workers = (args.events, args.users, args.producers, args.writers)
            if args.events and args.warm_up:
                # A broker just started compiles its hot paths in its first seconds of load
                # (the first measure ran 20 % slower on a fresh broker than on a warm one); a
                # production broker is warm. Same path, own topic, not reported.
                warm = _settings(base, ends, dsn, run, "warm")
                throughput(warm, args.warm_up, *workers[1:], seed="warm")
            if args.events:
                results["throughput"] = throughput(_settings(base, ends, dsn, run, "log"), *workers)
                results["drain"] = drain(_settings(base, ends, dsn, run, "drain"), *workers)
            if args.rate:
                results["latency"] = latency(
                    _settings(base, ends, dsn, run, "rate"), args.rate, args.rate_seconds
                )
            if args.consolidate:
                cons = _settings(base, ends, dsn, run, "cons")
                cons = cons.model_copy(
                    update={
                        "chroma": ChromaSettings(
                            mode="http", url=ends.chroma_url, collection=collection
                        )
                    }
                )
                users = max(1, args.consolidate // 20)
                results["consolidation"] = consolidation(
                    cons, make_events(args.consolidate, users, "cons")
                )
    print(markdown_table(["measure", "value"], _rows(results)))
    print(
        f"\nload average at the end {'/'.join(f'{x:.1f}' for x in os.getloadavg())}"
        f" (1/5/15 min) on {os.cpu_count()} CPUs"
    )
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=2) + "\n")


def _rows(results: dict[str, dict[str, float]]) -> list[list[str]]:
    rows = []
    if t := results.get("throughput"):
        who = f"{t['producers']:.0f} producer and {t['writers']:.0f} log-writer processes"
        rows += [
            [f"events published ({who})", f"{t['events']:,.0f}"],
            ["publish rate", f"{t['publish_events_per_s']:,.0f} events/s"],
            ["producers -> Kafka -> Postgres log", f"{t['log_events_per_s']:,.0f} events/s"],
            ["producer CPU per event", f"{t['producer_cpu_us_per_event']:.0f} us"],
            ["log-writer CPU per event", f"{t['writer_cpu_us_per_event']:.0f} us"],
        ]
    if d := results.get("drain"):
        rows += [
            [
                f"Kafka -> Postgres log, events waiting ({d['writers']:.0f} log writers)",
                f"{d['log_events_per_s']:,.0f} events/s"
                if "log_events_per_s" in d
                else "not measured: all logged while the writers joined (use more --events)",
            ],
            ["log-writer CPU per event (drain)", f"{d['writer_cpu_us_per_event']:.0f} us"],
        ]
    if lat := results.get("latency"):
        rows += [
            [
                f"producer-to-log at {lat['offered_per_s']:,.0f} events/s, p50",
                f"{lat['p50_ms']:.1f} ms",
            ],
            ["producer-to-log, p99", f"{lat['p99_ms']:.1f} ms"],
        ]
    if con := results.get("consolidation"):
        rows.append(
            [
                f"consolidation, offline backend ({con['events']:,.0f} events)",
                f"{con['events_per_s']:,.0f} events/s",
            ]
        )
    return rows


if __name__ == "__main__":
    main()
