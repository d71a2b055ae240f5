"""Ingest: events from producers through Kafka into the Postgres log, and consolidation.

    python -m bench.ingest [--events 100000] [--users 1000] [--rate 1000] [--rate-seconds 10]
        [--consolidate 2000] [--json-out FILE] [services options]

Three measures, each on a topic of its own:

1. throughput: `--events` events over `--users` users published by one `KafkaEventPublisher`
   in batches of 1,000 while one `LogWriter` (as `memoryd log-writer` runs it) consumes them;
   events/s from the first publish to the last event in `context_events`;
2. latency: `--rate` events/s for `--rate-seconds`, published every 10 ms; producer-to-log
   time is `recorded_at` (Postgres, at insert) minus `occurred_at` (set just before publish);
3. consolidation: `--consolidate` events (20 per user, one batch each) through the
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
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from bench import services
from bench.locomo.metrics import markdown_table
from memoryd import wiring
from memoryd.settings import ChromaSettings, Settings
from producers.contract import ContextEvent, EventType, Source, SourceMetadata

ORGANIZATION = "bench-org"
PUBLISH_BATCH = 1_000
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


def make_events(count: int, users: int, seed: str) -> list[ContextEvent]:
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
        for i in range(count)
    ]


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


def throughput(settings: Settings, events: Sequence[ContextEvent]) -> dict[str, float]:
    wiring.ensure_topics(settings)
    with wiring.core(settings) as c, _Writer(c):
        publisher = wiring.publisher(settings)
        try:
            started = time.perf_counter()
            for i in range(0, len(events), PUBLISH_BATCH):
                publisher.publish(events[i : i + PUBLISH_BATCH])
            published = time.perf_counter()
        finally:
            publisher.close()
        done = _wait_logged(c, settings.kafka.topic, len(events), 600)
    return {
        "events": len(events),
        "publish_events_per_s": len(events) / (published - started),
        "log_events_per_s": len(events) / (done - started),
    }


def latency(settings: Settings, rate: int, seconds: float) -> dict[str, float]:
    wiring.ensure_topics(settings)
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
    wiring.ensure_topics(settings)
    publisher = wiring.publisher(settings)
    try:
        publisher.publish(events)
    finally:
        publisher.close()
    with wiring.core(settings) as c:
        started = time.perf_counter()
        wiring.processor(c).run_until_idle(idle_s=3.0, deadline_s=1800)
        wiring.indexer(c).drain_pending()
        # run_until_idle waits idle_s of quiet at the end: that is not consolidation time.
        elapsed = time.perf_counter() - started - 3.0
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
    parser.add_argument("--consolidate", type=int, default=2_000)
    parser.add_argument("--json-out", type=Path)
    services.add_options(parser, kafka=True)
    args = parser.parse_args(argv)
    base = Settings()
    results: dict[str, dict[str, float]] = {}
    with services.endpoints(args, base, kafka=True) as ends:
        run = services.run_id()
        topics = [
            f"bench-ingest-{run}-{p}{s}" for p in ("log", "rate", "cons") for s in ("", ".dlq")
        ]
        with (
            services.scratch_database(ends.postgres_dsn, "bench_ingest", keep=args.keep) as dsn,
            services.scratch_topics(ends.kafka_bootstrap, topics, keep=args.keep),
            services.scratch_collection(
                ends.chroma_url, f"bench_ingest_{run}", keep=args.keep
            ) as collection,
        ):
            events = make_events(args.events, args.users, "log")
            results["throughput"] = throughput(_settings(base, ends, dsn, run, "log"), events)
            results["latency"] = latency(
                _settings(base, ends, dsn, run, "rate"), args.rate, args.rate_seconds
            )
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
    t, lat, con = results["throughput"], results["latency"], results["consolidation"]
    print(
        markdown_table(
            ["measure", "value"],
            [
                ["events published (one producer, batches of 1,000)", f"{t['events']:,.0f}"],
                ["publish rate", f"{t['publish_events_per_s']:,.0f} events/s"],
                ["producers -> Kafka -> Postgres log", f"{t['log_events_per_s']:,.0f} events/s"],
                [
                    f"producer-to-log at {lat['offered_per_s']:,.0f} events/s, p50",
                    f"{lat['p50_ms']:.1f} ms",
                ],
                ["producer-to-log, p99", f"{lat['p99_ms']:.1f} ms"],
                [
                    f"consolidation, offline backend ({con['events']:,.0f} events)",
                    f"{con['events_per_s']:,.0f} events/s",
                ],
            ],
        )
    )
    print(
        f"\nload average at the end {'/'.join(f'{x:.1f}' for x in os.getloadavg())}"
        f" (1/5/15 min) on {os.cpu_count()} CPUs"
    )
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
