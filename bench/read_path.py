"""Read-path latency at scale: injection and retrieval for users of 100 to 10,000 facts.

    python -m bench.read_path [--facts 1000000] [--facts-per-user 100,1000,10000]
        [--heavy-users 10] [--samples 300] [--distinct-texts 4000] [--json-out FILE]
        [--dsn DSN] [--chroma-url URL] [--keep]

Loads synthetic memory (`bench.synthetic_memory`) into a scratch Postgres database and Chroma
collection, growing it to each total in `--facts` in turn. Every size tier of
`--facts-per-user` but the smallest has `--heavy-users` users; the smallest tier fills the rest
of the total. At each total and for each tier it measures, over random users of the tier with
one of their two connections active and a chat message no other request asks (a lead-in
and a templated question, so that each pays for its query embedding):

- injection: what every turn is given whatever its query (W, S, learned info, the active
  connection's learned info), as the service serves it: the `injection` stage of the bundle's
  timings (a version check, then the per-version cache);
- retrieval: a full `ContextService.assemble` (query embedding, dense and keyword search,
  truth check, ranking, rendering), for each budget.

One service serves every call, as one API process would, and each sampled user is read once
before measuring: the figures are the steady state of a memory that has been read since its
last consolidation. That first read (which fills the memory's vector matrix from Chroma) is
reported on its own. Prints Markdown tables; `--json-out` writes the rows and the resident
memory of the process serving the reads.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench import services
from bench import synthetic_memory as synthetic
from bench.locomo.metrics import markdown_table
from domain.ids import MemoryKey
from memoryd import wiring
from memoryd.settings import Settings
from store.embeddings import MiniLmEmbedder
from store.read.context_service import ContextService
from store.read.ranking import Budget

LOAD_BATCH = 20_000


@dataclass(frozen=True)
class Latencies:
    p50: float
    p99: float
    mean: float

    @classmethod
    def of(cls, samples_ms: Sequence[float]) -> Latencies:
        p50, p99 = np.percentile(samples_ms, [50, 99])
        return cls(float(p50), float(p99), statistics.fmean(samples_ms))


@dataclass(frozen=True)
class Population:
    """Users per size tier at one total: heavy tiers fixed, the smallest fills the rest."""

    tiers: dict[int, list[str]]

    @classmethod
    def at(cls, total: int, per_user: Sequence[int], heavy_users: int) -> Population:
        smallest, *heavier = sorted(set(per_user))
        rest = total - heavy_users * sum(heavier)
        if rest < 0 or rest % smallest:
            raise SystemExit(
                f"{total:,} facts cannot hold {heavy_users} users of each of {heavier} facts"
                f" and fill the rest with users of {smallest}"
            )
        tiers = {smallest: synthetic.user_ids(rest // smallest)}
        for n in heavier:
            tiers[n] = synthetic.user_ids(heavy_users, tier=n)
        return cls(tiers)


@dataclass(frozen=True)
class Row:
    facts: int
    per_user: int
    measure: str
    budget: Budget | None
    latencies: Latencies

    def as_json(self) -> dict[str, object]:
        return {
            "facts": self.facts,
            "facts_per_user": self.per_user,
            "measure": self.measure,
            "budget": None if self.budget is None else self.budget.value,
            "p50_ms": round(self.latencies.p50, 3),
            "p99_ms": round(self.latencies.p99, 3),
        }


@dataclass(frozen=True)
class Stages:
    facts: int
    per_user: int
    budget: Budget
    p50_ms: dict[str, float]


@dataclass
class Results:
    rows: list[Row]
    stages: list[Stages]
    first_read: list[tuple[int, int, Latencies]]  # facts, per user, dense stage on first read
    loads: list[tuple[int, float, float]]  # facts, Postgres s, Chroma s
    rss_mb: list[tuple[int, float]]


def sample_requests(
    users: Sequence[str], samples: int, seed: int, questions: Iterator[str] | None = None
) -> list[tuple[str, str, str]]:
    """(user, active connection, query) triples, the same for the same seed. The queries come
    from `questions` (by default a stream of its own) and no two of a stream are alike, so
    every request embeds its query as a chat turn does."""
    rng = random.Random(seed)
    asked = synthetic.chat_turns(random.Random(seed)) if questions is None else questions
    out = []
    for query in itertools.islice(asked, samples):
        user = rng.choice(users)
        out.append((user, rng.choice(synthetic.connection_ids(user)), query))
    return out


def _assemble(
    service: ContextService, requests: Sequence[tuple[str, str, str]], budget: Budget
) -> tuple[list[float], dict[str, list[float]]]:
    total: list[float] = []
    stages: dict[str, list[float]] = {}
    for user, connection, query in requests:
        started = time.perf_counter()
        bundle = service.assemble(
            MemoryKey(synthetic.ORGANIZATION, user), query, [connection], budget
        )
        total.append((time.perf_counter() - started) * 1000)
        for stage, ms in bundle.timings_ms.items():
            stages.setdefault(stage, []).append(ms)
    return total, stages


def measure_tier(
    service: ContextService, users: Sequence[str], facts: int, per_user: int, samples: int,
    seed: int, questions: Iterator[str], out: Results,
) -> None:  # fmt: skip
    # A set of requests per budget (a text asked twice would find its vector in the embedder's
    # cache), and first a read of every user they name, with questions of its own.
    every = sample_requests(users, samples * len(Budget), seed, questions)
    first = [
        (user, connection, next(questions))
        for user, connection, _ in {r[0]: r for r in every}.values()
    ]
    _, first_laps = _assemble(service, first, Budget.BALANCED)
    out.first_read.append((facts, per_user, Latencies.of(first_laps["dense"])))
    for k, budget in enumerate(Budget):
        total, laps = _assemble(service, every[k * samples : (k + 1) * samples], budget)
        if budget is Budget.BALANCED:
            injection = Latencies.of(laps["injection"])
            out.rows.append(Row(facts, per_user, "injection", None, injection))
        out.rows.append(Row(facts, per_user, "retrieval", budget, Latencies.of(total)))
        p50 = {stage: float(np.percentile(ms, 50)) for stage, ms in laps.items()}
        out.stages.append(Stages(facts, per_user, budget, p50))


def resident_mb() -> float:
    """This process's resident set now (it is the one serving the reads)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def load(
    c: wiring.Core, ends: services.Endpoints, collection: str, pool: synthetic.TextPool,
    users: Sequence[str], numbers: range, seed: int,
) -> tuple[float, float]:  # fmt: skip
    """Facts `numbers` of these users into Postgres and Chroma: (Postgres s, Chroma s)."""
    pg_s = chroma_s = 0.0
    for facts, vectors in synthetic.fact_batches(pool, users, numbers, seed, LOAD_BATCH):
        started = time.perf_counter()
        synthetic.load_facts(c, facts)
        pg_s += time.perf_counter() - started
        started = time.perf_counter()
        synthetic.index_facts(ends.chroma_url, collection, c.embedder, facts, vectors)
        chroma_s += time.perf_counter() - started
    return pg_s, chroma_s


def publish(args: argparse.Namespace, results: Results, elapsed_s: float) -> None:
    print(_report(args, results, elapsed_s), flush=True)
    if args.json_out:
        document = {
            "rows": [r.as_json() for r in results.rows],
            "rss_mb": round(max(mb for _, mb in results.rss_mb), 1),
        }
        args.json_out.write_text(json.dumps(document, indent=2) + "\n")


def run(
    args: argparse.Namespace, sizes: Sequence[int], per_user: Sequence[int], began: float
) -> Results:
    base = Settings()
    embedder = MiniLmEmbedder(model_name=base.embedding_model)
    pool = synthetic.TextPool.embedded(args.distinct_texts, embedder, args.seed)
    out = Results([], [], [], [], [])
    with (
        services.endpoints(args, base, kafka=False) as ends,
        services.scratch_memory(base, ends, "read", keep=args.keep) as settings,
    ):
        collection = settings.chroma.collection
        loaded: dict[str, int] = {}
        # One stream for the whole run: a question asked in one tier would find its vector
        # in the embedder's cache in the next.
        questions = synthetic.chat_turns(random.Random(args.seed))
        with wiring.core(settings) as c, wiring.read_path(c) as service:
            for size in sizes:
                population = Population.at(size, per_user, args.heavy_users)
                pg_s = chroma_s = 0.0
                for n, users in population.tiers.items():
                    new = [u for u in users if u not in loaded]
                    synthetic.load_users(c, new, args.seed)
                    p, ch = load(c, ends, collection, pool, new, range(n), args.seed)
                    pg_s, chroma_s = pg_s + p, chroma_s + ch
                    loaded |= dict.fromkeys(new, n)
                synthetic.analyze(c)
                out.loads.append((size, pg_s, chroma_s))
                for n, users in sorted(population.tiers.items()):
                    measure_tier(service, users, size, n, args.samples, args.seed, questions, out)
                out.rss_mb.append((size, resident_mb()))
                # Written as each total is measured: a failure later loses nothing.
                publish(args, out, time.perf_counter() - began)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", default="1000000", help="comma-separated totals")
    parser.add_argument("--facts-per-user", default="100,1000,10000", help="size tiers")
    parser.add_argument("--heavy-users", type=int, default=10, help="users per larger tier")
    parser.add_argument("--samples", type=int, default=300, help="calls per measure and tier")
    parser.add_argument("--distinct-texts", type=int, default=4_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json-out", type=Path, help="write the rows as JSON here")
    services.add_options(parser, kafka=False)
    args = parser.parse_args(argv)
    sizes = sorted(int(s) for s in args.facts.split(","))
    per_user = sorted(int(s) for s in args.facts_per_user.split(","))
    for size in sizes:
        Population.at(size, per_user, args.heavy_users)  # refuse impossible sizes up front
    run(args, sizes, per_user, time.perf_counter())


def _report(args: argparse.Namespace, r: Results, total_s: float) -> str:
    table = markdown_table(
        ["facts", "facts/user", "measure", "budget", "p50", "p99", "mean"],
        [
            [
                f"{x.facts:,}",
                f"{x.per_user:,}",
                x.measure,
                "-" if x.budget is None else x.budget.value,
                f"{x.latencies.p50:.1f} ms",
                f"{x.latencies.p99:.1f} ms",
                f"{x.latencies.mean:.1f} ms",
            ]
            for x in r.rows
        ],
        left=4,
    )
    names = list(dict.fromkeys(name for s in r.stages for name in s.p50_ms))
    stage_table = markdown_table(
        ["facts", "facts/user", "budget", *names],
        [
            [f"{s.facts:,}", f"{s.per_user:,}", s.budget.value]
            + [f"{s.p50_ms.get(n, 0.0):.1f}" for n in names]
            for s in r.stages
        ],
        left=3,
    )
    first_table = markdown_table(
        ["facts", "facts/user", "dense stage p50", "p99"],
        [
            [f"{n:,}", f"{u:,}", f"{lat.p50:.1f} ms", f"{lat.p99:.1f} ms"]
            for n, u, lat in r.first_read
        ],
        left=2,
    )
    load_table = markdown_table(
        ["facts", "Postgres COPY (added facts)", "Chroma upsert (added facts)", "RSS after"],
        [
            [f"{n:,}", f"{pg:.1f} s", f"{ch:.1f} s", f"{rss:.0f} MB"]
            for (n, pg, ch), (_, rss) in zip(r.loads, r.rss_mb, strict=True)
        ],
    )
    return "\n".join(
        [
            (
                f"Tiers {args.facts_per_user} facts per user ({args.heavy_users} users in each"
                f" larger tier), {args.samples} sequential calls per measure and tier (random"
                " user of the tier, one of its connections active, a chat message no other call"
                " of the run sends) after one read of each sampled user;"
                f" {args.distinct_texts:,} distinct texts embedded, fact vectors derived from them."
            ),
            "",
            table,
            "",
            "p50 of each stage of assemble, ms (the bundle's own timings):",
            "",
            stage_table,
            "",
            "First read of a memory since its last consolidation (fills its vector matrix):",
            "",
            first_table,
            "",
            "Load, and the resident memory of the process serving the reads:",
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
