"""Read-path latency at scale: injection and full retrieval over many users' facts.

    python -m bench.read_path [--facts 10000,100000] [--users 1000] [--samples 500]
        [--distinct-texts 10000] [--dsn DSN] [--chroma-url URL] [--keep]

Loads synthetic memory (`bench.synthetic_memory`) straight into a scratch Postgres database
(`user_memory`, `connections`, `memory_facts`, written with COPY) and a scratch Chroma
collection (through `ChromaVectorIndex.upsert`), growing it to each size in `--facts` in turn,
spread evenly over `--users`. At each size it measures, over random users:

- injection: what every turn is given whatever its query (W, S, learned info, the active
  connection's learned info) read from Postgres with `load_state` and `connections` (the
  service has no injection method of its own); and, as the service serves it, the
  `injection` stage of the bundle's timings (a version check, then a cache hit or the reads);
- retrieval: a full `ContextService.assemble` (query embedding, dense and keyword search,
  ranking, rendering), for each budget, with a fresh service (cold injection cache) per budget.

Fact texts come from templates with per-user variation; each distinct text is embedded once
and its vector reused for every fact that has that text (`--distinct-texts` of them), which
keeps the load to about a minute instead of embedding every fact. Prints Markdown tables with
the seed's limits (50 ms injection, 300 ms retrieval) beside the measured p50/p99.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from bench import services
from bench.locomo.metrics import markdown_table
from bench.synthetic_memory import (
    CONNECTIONS_PER_USER,
    ORGANIZATION,
    QUERIES,
    connection_ids,
    fill,
    index_facts,
    load_facts,
    load_users,
    make_facts,
    text_pool,
    user_ids,
)
from domain.ids import MemoryKey
from memoryd import wiring
from memoryd.settings import ChromaSettings, MetricsSettings, Settings
from store.embeddings import CachingEmbedder, MiniLmEmbedder
from store.read.ranking import Budget

SEED_INJECTION_MS = 50.0
SEED_RETRIEVAL_MS = 300.0


# --- measuring -------------------------------------------------------------------------


@dataclass(frozen=True)
class Latencies:
    p50: float
    p99: float
    mean: float

    @classmethod
    def of(cls, samples_ms: Sequence[float]) -> Latencies:
        p50, p99 = np.percentile(samples_ms, [50, 99])
        return cls(float(p50), float(p99), statistics.fmean(samples_ms))


def timed(calls: Iterator[Callable[[], object]]) -> list[float]:
    out = []
    for call in calls:
        started = time.perf_counter()
        call()
        out.append((time.perf_counter() - started) * 1000)
    return out


def _requests(users: Sequence[str], samples: int, seed: int) -> list[tuple[str, str, str]]:
    """(user, active connection, query) triples, the same for the same seed."""
    rng = random.Random(seed)
    out = []
    for _ in range(samples):
        user = rng.choice(users)
        out.append((user, rng.choice(connection_ids(user)), fill(rng.choice(QUERIES), rng)))
    return out


def measure_injection(c: wiring.Core, requests: Sequence[tuple[str, str, str]]) -> list[float]:
    """W, S and learned info (load_state) plus the active connection's learned info."""

    def call(user: str, connection: str) -> Callable[[], object]:
        key = MemoryKey(ORGANIZATION, user)
        return lambda: (c.memory.load_state(key), c.memory.connections(key, [connection]))

    return timed(call(u, conn) for u, conn, _ in requests)


def measure_retrieval(
    c: wiring.Core, requests: Sequence[tuple[str, str, str]], budget: Budget
) -> tuple[list[float], dict[str, list[float]]]:
    """Full assemble latencies, and the stage timings the bundles report.

    A fresh service (so an empty injection cache) per call of this function: every budget
    meets the same sequence of cache misses and hits.
    """
    total: list[float] = []
    stages: dict[str, list[float]] = {}
    with wiring.read_path(c) as service:
        for user, connection, query in requests:
            started = time.perf_counter()
            bundle = service.assemble(MemoryKey(ORGANIZATION, user), query, [connection], budget)
            total.append((time.perf_counter() - started) * 1000)
            for stage, ms in bundle.timings_ms.items():
                stages.setdefault(stage, []).append(ms)
    return total, stages


# --- the run ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    facts: int
    measure: str
    limit_ms: float
    latencies: Latencies


@dataclass(frozen=True)
class Stages:
    facts: int
    budget: Budget
    p50_ms: dict[str, float]


def run_scale(
    c: wiring.Core, users: Sequence[str], samples: int, seed: int, facts: int
) -> tuple[list[Row], list[Stages]]:
    warm = _requests(users, 50, seed + 1)
    measure_injection(c, warm)
    measure_retrieval(c, warm, Budget.BALANCED)
    requests = _requests(users, samples, seed)
    injection = Latencies.of(measure_injection(c, requests))
    rows = [Row(facts, "injection: load_state + connection info", SEED_INJECTION_MS, injection)]
    retrievals, stages = [], []
    for budget in Budget:
        total, laps = measure_retrieval(c, requests, budget)
        if budget is Budget.BALANCED and "injection" in laps:
            name = "injection stage inside assemble (balanced)"
            rows.append(Row(facts, name, SEED_INJECTION_MS, Latencies.of(laps["injection"])))
        name = f"retrieval: assemble, budget {budget.value}"
        retrievals.append(Row(facts, name, SEED_RETRIEVAL_MS, Latencies.of(total)))
        p50 = {stage: float(np.percentile(ms, 50)) for stage, ms in laps.items()}
        stages.append(Stages(facts, budget, p50))
    return rows + retrievals, stages


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", default="10000,100000", help="comma-separated sizes")
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=500, help="calls per measure and size")
    parser.add_argument("--distinct-texts", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=7)
    services.add_options(parser, kafka=False)
    args = parser.parse_args(argv)
    sizes = sorted(int(s) for s in args.facts.split(","))
    if any(s % args.users for s in sizes):
        raise SystemExit("every --facts size must be a multiple of --users")

    began = time.perf_counter()
    base = Settings()
    users = user_ids(args.users)
    pool = text_pool(args.distinct_texts, args.seed)
    embedder = CachingEmbedder(MiniLmEmbedder(), max_entries=args.distinct_texts)
    rows: list[Row] = []
    stages: list[Stages] = []
    loads: list[tuple[int, float, float]] = []
    with services.endpoints(args, base, kafka=False) as ends:
        run = services.run_id()
        with (
            services.scratch_database(ends.postgres_dsn, "bench_read", keep=args.keep) as dsn,
            services.scratch_collection(
                ends.chroma_url, f"bench_read_{run}", keep=args.keep
            ) as collection,
        ):
            settings = base.model_copy(
                update={
                    "postgres": base.postgres.model_copy(update={"dsn": dsn}),
                    "chroma": ChromaSettings(
                        mode="http", url=ends.chroma_url, collection=collection
                    ),
                    "metrics": MetricsSettings(enabled=False),
                }
            )
            with wiring.core(settings) as c:
                load_users(c, users, args.seed)
                loaded_per_user = 0
                for size in sizes:
                    per_user = size // args.users
                    started = time.perf_counter()
                    numbers = range(loaded_per_user, per_user)
                    facts = make_facts(users, numbers, sizes[-1] // args.users, pool, args.seed)
                    load_facts(c, facts)
                    pg_s = time.perf_counter() - started
                    index_facts(ends.chroma_url, collection, embedder, facts)
                    loads.append((size, pg_s, time.perf_counter() - started - pg_s))
                    loaded_per_user = per_user
                    measured, laps = run_scale(c, users, args.samples, args.seed, size)
                    rows.extend(measured)
                    stages.extend(laps)
    print(_report(args, rows, stages, loads, time.perf_counter() - began))


def _report(
    args: argparse.Namespace,
    rows: Sequence[Row],
    stages: Sequence[Stages],
    loads: Sequence[tuple[int, float, float]],
    total_s: float,
) -> str:
    names = list(dict.fromkeys(name for s in stages for name in s.p50_ms))
    stage_table = markdown_table(
        ["facts", "budget", *names],
        [
            [f"{s.facts:,}", s.budget.value, *(f"{s.p50_ms.get(n, 0.0):.1f}" for n in names)]
            for s in stages
        ],
        left=2,
    )
    table = markdown_table(
        ["facts", "measure", "seed limit", "p50", "p99", "mean"],
        [
            [
                f"{r.facts:,}",
                r.measure,
                f"{r.limit_ms:.0f} ms",
                f"{r.latencies.p50:.1f} ms",
                f"{r.latencies.p99:.1f} ms",
                f"{r.latencies.mean:.1f} ms",
            ]
            for r in rows
        ],
        left=2,
    )
    load_table = markdown_table(
        ["facts", "Postgres COPY (added facts)", "Chroma upsert (added facts)"],
        [[f"{n:,}", f"{pg:.1f} s", f"{ch:.1f} s"] for n, pg, ch in loads],
    )
    return "\n".join(
        [
            (
                f"{args.users:,} users, {args.samples} sequential calls per measure and size "
                f"(random user, one of its {CONNECTIONS_PER_USER} connections active, a "
                f"templated question); {args.distinct_texts:,} distinct fact texts, each "
                "embedded once. Injection = load_state (W, S, learned info) + the active "
                "connection's learned info; retrieval = ContextService.assemble, query "
                "embedding included."
            ),
            "",
            table,
            "",
            "p50 of each stage of assemble, ms (the bundle's own timings):",
            "",
            stage_table,
            "",
            "Load:",
            "",
            load_table,
            "",
            (
                f"Whole bench: {total_s:.0f} s; load average at the end "
                f"{'/'.join(f'{x:.1f}' for x in os.getloadavg())} (1/5/15 min) on "
                f"{os.cpu_count()} CPUs."
            ),
        ]
    )


if __name__ == "__main__":
    main()
