"""Read-path latency at scale: injection and full retrieval over many users' facts.

    python -m bench.read_path [--facts 10000,100000] [--users 1000] [--samples 500]
        [--distinct-texts 10000] [--dsn DSN] [--chroma-url URL] [--keep]

Loads synthetic memory straight into a scratch Postgres database (`user_memory`,
`connections`, `memory_facts`, written with COPY) and a scratch Chroma collection (through
`ChromaVectorIndex.upsert`), growing it to each size in `--facts` in turn, spread evenly over
`--users`. At each size it measures, over random users:

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
import io
import json
import os
import random
import statistics
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np

from bench import services
from bench.locomo.metrics import markdown_table
from domain.ids import MemoryKey, fact_id_for
from domain.model import Fact, FactStatus, FactType, Provenance, SurfacePolicy
from domain.ports import Embedder, Vector
from memoryd import wiring
from memoryd.settings import ChromaSettings, MetricsSettings, Settings
from store.chroma.vector_index import ChromaVectorIndex, close_client, http_client
from store.embeddings import MiniLmEmbedder
from store.read.context_service import Budget

SEED_INJECTION_MS = 50.0
SEED_RETRIEVAL_MS = 300.0
ORGANIZATION = "bench-org"
CONNECTIONS_PER_USER = 2
CHROMA_BATCH = 2_000
NOW = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)

# --- synthetic memory ------------------------------------------------------------------

NAMES = [
    "Ana", "Ben", "Chen", "Dara", "Eli", "Farah", "Goran", "Hana", "Ivo", "Jun", "Kofi", "Lena",
    "Mateo", "Nia", "Omar", "Priya", "Quinn", "Rosa", "Sami", "Tomas", "Uma", "Vik", "Wen", "Yara",
]  # fmt: skip
CITIES = [
    "Berlin", "Lisbon", "Kyoto", "Toronto", "Nairobi", "Oslo", "Lima", "Pune", "Austin", "Lyon",
    "Seoul", "Dublin", "Accra", "Porto", "Krakow", "Denver", "Hanoi", "Bergen", "Quito", "Turin",
]  # fmt: skip
PROJECTS = [
    "billing", "search", "onboarding", "ledger", "notifications", "payments", "mobile", "pricing",
    "analytics", "checkout", "identity", "reporting", "storage", "routing", "support", "growth",
]  # fmt: skip
TOOLS = [
    "Jira", "Linear", "Notion", "PagerDuty", "Figma", "Grafana", "Postgres", "Kafka", "Terraform",
    "Sentry", "Airflow", "dbt",
]  # fmt: skip
MONTHS = [
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
]  # fmt: skip
HOBBIES = [
    "climbing", "the cello", "sourdough baking", "chess", "trail running", "pottery", "sailing",
    "watercolor painting", "birdwatching", "salsa dancing", "woodworking", "Japanese",
]  # fmt: skip
FOODS = [
    "vegetarian food", "spicy ramen", "oat flat whites", "green tea", "dark chocolate", "tacos",
    "Ethiopian food", "black coffee", "sushi", "lentil soup",
]  # fmt: skip
TEMPLATES = [
    "The user lives in {city} and commutes by bike most days.",
    "The user works on the {project} team and reports to {name}.",
    "The user is migrating the {project} service to {tool} before the end of {month}.",
    "The user asked to be reminded about the {project} design review on {month} {day}.",
    "The user prefers concise answers with code examples about {tool}.",
    "The user's manager {name} wants weekly status notes on the {project} launch.",
    "The user is planning a trip to {city} in {month} with {name}.",
    "The user spends weekends on {hobby} and has done so for {n} years.",
    "The user likes {food} and avoids meetings before 10am.",
    "The user's colleague {name} owns the {tool} integration for {project}.",
    "The {project} launch slipped by {n} weeks because a {tool} migration was late.",
    "The user has a cat named {name} who is {n} years old.",
    "The user is learning {hobby} in the evenings, about {n} hours a week.",
    "The user keeps incident notes for {project} in {tool}.",
    "The user met {name} in {city} in {month} to discuss the {project} roadmap.",
]
QUERIES = [
    "Where does the user live?",
    "What is the user working on this month?",
    "Who is the user's manager?",
    "When is the {project} design review?",
    "What does the user do on weekends?",
    "Which tools does the user use for {project}?",
    "Is the user travelling to {city} soon?",
    "What food does the user like?",
    "Why did the {project} launch slip?",
    "What should I remind the user about?",
]


def _fill(template: str, rng: random.Random) -> str:
    return template.format(
        city=rng.choice(CITIES),
        project=rng.choice(PROJECTS),
        tool=rng.choice(TOOLS),
        month=rng.choice(MONTHS),
        name=rng.choice(NAMES),
        hobby=rng.choice(HOBBIES),
        food=rng.choice(FOODS),
        day=rng.randint(1, 28),
        n=rng.randint(2, 12),
    )


def text_pool(size: int, seed: int = 5) -> list[str]:
    """`size` distinct fact texts, deterministic for a seed."""
    rng = random.Random(seed)
    pool: dict[str, None] = {}
    attempts = 0
    while len(pool) < size:
        attempts += 1
        if attempts > size * 50:
            raise ValueError(f"the templates cannot make {size} distinct texts")
        pool[_fill(rng.choice(TEMPLATES), rng)] = None
    return list(pool)


def user_ids(count: int) -> list[str]:
    return [f"bench-user-{i:05d}" for i in range(count)]


def connection_ids(user_id: str) -> list[str]:
    return [f"{user_id}-conn-{j}" for j in range(CONNECTIONS_PER_USER)]


def make_facts(
    users: Sequence[str], numbers: range, most: int, pool: Sequence[str], seed: int
) -> list[Fact]:
    """Facts number `numbers` of every user, out of at most `most` per user: the same facts
    for the same seed, so growing to a larger size adds to what is loaded."""
    if most > len(pool):
        raise ValueError(f"{most} facts per user need at least as many distinct texts")
    facts = []
    for user in users:
        texts = random.Random(f"{seed}:{user}").sample(pool, most)
        for i in numbers:
            rng_i = random.Random(f"{seed}:{user}:{i}")
            content = texts[i]
            connection = rng_i.choice(connection_ids(user)) if rng_i.random() < 0.2 else None
            roll = rng_i.random()
            status = (
                FactStatus.ARCHIVED
                if roll < 0.03
                else FactStatus.CONTRADICTED
                if roll < 0.05
                else FactStatus.ACTIVE
            )
            at = NOW - timedelta(days=rng_i.uniform(0, 180))
            kind = rng_i.choice([FactType.PROFILE, FactType.PREFERENCE, FactType.EPISODIC])
            facts.append(
                Fact(
                    fact_id=fact_id_for(MemoryKey(ORGANIZATION, user), content, connection),
                    user_id=user,
                    organization_id=ORGANIZATION,
                    content=content,
                    fact_type=kind,
                    surface=SurfacePolicy.SPEAK,
                    status=status,
                    confidence=round(rng_i.uniform(0.6, 1.0), 2),
                    salience=round(rng_i.uniform(0.3, 0.9), 2),
                    provenance=Provenance(
                        context_type="fact",
                        source="interactive",
                        connection_id=connection,
                        message_id=f"msg-{i}",
                        source_event_ids=(uuid.uuid5(uuid.NAMESPACE_URL, f"{user}/{i}"),),
                    ),
                    created_by_run=uuid.uuid5(uuid.NAMESPACE_URL, f"{user}/run"),
                    created_at=at,
                    updated_at=at,
                    pinned=rng_i.random() < 0.01,
                )
            )
    return facts


def working_memory(user: str, rng: random.Random) -> str:
    """About 300 words, the size a consolidated W settles at."""
    sentences = [_fill(rng.choice(TEMPLATES), rng) for _ in range(30)]
    return f"Context for {user}. " + " ".join(sentences)


def scaffold(rng: random.Random) -> dict[str, object]:
    return {
        "Role": f"Engineer on the {rng.choice(PROJECTS)} team",
        "Location": rng.choice(CITIES),
        "Projects": [_fill(rng.choice(TEMPLATES), rng) for _ in range(5)],
        "Preferences": [_fill(rng.choice(TEMPLATES), rng) for _ in range(5)],
        "Profile": [_fill(rng.choice(TEMPLATES), rng) for _ in range(6)],
    }


# --- loading ---------------------------------------------------------------------------

_FACT_COLUMNS = (
    "fact_id, user_id, organization_id, content, context_type, source, connection_id,"
    " message_id, source_event_ids, fact_type, surface, status, pinned, confidence, salience,"
    " created_by_run, created_at, updated_at, indexed_at, version"
)


def _copy_text(value: object) -> str:
    """One field in COPY's text format."""
    if value is None:
        return r"\N"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, tuple):
        return "{" + ",".join(str(v) for v in value) + "}"
    text = value.isoformat() if isinstance(value, datetime) else str(value)
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def load_users(c: wiring.Core, users: Sequence[str], seed: int) -> None:
    rows, connections = [], []
    for user in users:
        rng = random.Random(f"{seed}:memory:{user}")
        learned = [_fill(rng.choice(TEMPLATES), rng) for _ in range(8)]
        rows.append(
            (
                user,
                ORGANIZATION,
                working_memory(user, rng),
                json.dumps(scaffold(rng)),
                json.dumps(learned),
                1,
                NOW,
            )
        )
        for connection in connection_ids(user):
            info = [f"{connection}: " + _fill(rng.choice(TEMPLATES), rng) for _ in range(3)]
            connections.append((user, connection, ORGANIZATION, json.dumps(info)))
    with c.pool.connection() as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO user_memory (user_id, organization_id, working_memory,"
            " information_scaffold, persistent_learned_info, version, updated_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)",
            rows,
        )
        cur.executemany(
            "INSERT INTO connections (user_id, connection_id, organization_id,"
            " persistent_learned_info) VALUES (%s, %s, %s, %s)",
            connections,
        )


def load_facts(c: wiring.Core, facts: Sequence[Fact]) -> None:
    buffer = io.StringIO()
    for f in facts:
        p = f.provenance
        fields = (
            f.fact_id, f.user_id, f.organization_id, f.content, p.context_type, p.source,
            p.connection_id, p.message_id, p.source_event_ids, f.fact_type.value,
            f.surface.value, f.status.value, f.pinned, f.confidence, f.salience,
            f.created_by_run, f.created_at, f.updated_at, NOW, f.version,
        )  # fmt: skip
        buffer.write("\t".join(_copy_text(v) for v in fields) + "\n")
    with c.pool.connection() as conn, conn.cursor() as cur:
        with cur.copy(f"COPY memory_facts ({_FACT_COLUMNS}) FROM STDIN") as copy:
            copy.write(buffer.getvalue())
        cur.execute("ANALYZE memory_facts")


class CachingEmbedder:
    """The embedder, computing each distinct text once (the pool repeats across users)."""

    def __init__(self, inner: Embedder) -> None:
        self._inner = inner
        self.model_name = inner.model_name
        self.dimension = inner.dimension
        self._vectors: dict[str, Vector] = {}

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        missing = list(dict.fromkeys(t for t in texts if t not in self._vectors))
        if missing:
            self._vectors.update(zip(missing, self._inner.embed(missing), strict=True))
        return [self._vectors[t] for t in texts]


def index_facts(
    chroma_url: str, collection: str, embedder: Embedder, facts: Sequence[Fact]
) -> None:
    client = http_client(chroma_url, timeout_s=120)
    try:
        index = ChromaVectorIndex(client, embedder, collection)
        for start in range(0, len(facts), CHROMA_BATCH):
            index.upsert(facts[start : start + CHROMA_BATCH])
    finally:
        close_client(client)


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
        out.append((user, rng.choice(connection_ids(user)), _fill(rng.choice(QUERIES), rng)))
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
    embedder = CachingEmbedder(MiniLmEmbedder())
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
