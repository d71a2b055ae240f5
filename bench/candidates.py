"""A flush's candidate search in memories of 100 to 10,000 facts.

    python -m bench.candidates [--facts 40000] [--facts-per-user 100,1000,10000]
        [--heavy-users 2] [--samples 30] [--observations 5] [--run-facts 5]
        [--json-out FILE]
        [--dsn DSN] [--chroma-url URL] [--keep]

Loads synthetic memory (`bench.synthetic_memory`, as `bench.read_path` does) into a scratch
Postgres database and Chroma collection, then times `HybridFactSearch.related` as a flush
calls it: `--observations` chat messages of one connection of a random user of the tier, three
facts each. Before every call the user's memory changes as between two of its batches: the
facts the previous run wrote are indexed (vectors in Chroma, marked in Postgres), a new run
writes `--run-facts` new facts, pending, and the memory's version goes up by one; so the
memory's entry is brought up to date each time. The first call for each user (the entry built
from nothing) is reported on its own.

Two searches, each on the same users and connections with texts of its own:
- `entries`: the processor's (`memoryd.wiring.candidate_search`), whose memories of more than
  `EXACT_SEARCH_MAX_FACTS` facts are answered from their entry held in process;
- `sql_and_chroma`: the same search without entries: Postgres's BM25 and Chroma's
  metadata-filtered query for those memories.

`--json-out` writes `{"rows": [{"facts": n, "facts_per_user": n, "search": s, "calls":
"first"|"returning", "p50_ms": x, "p99_ms": x}]}`.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench import services
from bench import synthetic_memory as synthetic
from bench.locomo.metrics import markdown_table
from bench.read_path import Population, load
from domain.ids import MemoryKey
from domain.model import Fact
from domain.ports import FactQuery, FactSearch, Vector
from memoryd import wiring
from memoryd.settings import Settings
from store.embeddings import MiniLmEmbedder
from store.read.candidate_search import HybridFactSearch
from store.read.fact_queries import PostgresReadModel

PER_OBSERVATION = 3


@dataclass(frozen=True)
class Row:
    facts: int
    per_user: int
    search: str
    calls: str
    p50_ms: float
    p99_ms: float

    def as_json(self) -> dict[str, object]:
        return {
            "facts": self.facts,
            "facts_per_user": self.per_user,
            "search": self.search,
            "calls": self.calls,
            "p50_ms": round(self.p50_ms, 2),
            "p99_ms": round(self.p99_ms, 2),
        }


class Runs:
    """What a user's runs write between two calls, as a consolidation and the indexer would."""

    def __init__(
        self,
        c: wiring.Core,
        ends: services.Endpoints,
        collection: str,
        pool: synthetic.TextPool,
        loaded: dict[str, int],
        args: argparse.Namespace,
    ) -> None:
        self._c, self._ends, self._collection, self._pool = c, ends, collection, pool
        self._next = dict(loaded)  # the next fact number of each user
        self._pending: dict[str, tuple[list[Fact], list[Vector]]] = {}
        self._per_run, self._seed = args.run_facts, args.seed

    def commit(self, key: MemoryKey) -> None:
        """Index the user's previous run, write a new one (its facts pending), raise the
        memory's version."""
        user = key.user_id
        indexed, vectors = self._pending.pop(user, ([], []))
        if indexed:
            synthetic.index_facts(
                self._ends.chroma_url, self._collection, self._c.embedder, indexed, vectors
            )
        start = self._next[user]
        self._next[user] = start + self._per_run
        facts, vectors = synthetic.make_facts(
            self._pool, user, range(start, start + self._per_run), self._seed
        )
        self._c.memory.insert_facts(facts)
        self._pending[user] = (facts, vectors)
        with self._c.pool.connection() as conn:
            conn.execute(
                "UPDATE memory_facts SET indexed_at = now() WHERE fact_id = ANY(%s)",
                ([f.fact_id for f in indexed],),
            )
            conn.execute(
                "UPDATE user_memory SET version = version + 1"
                " WHERE organization_id = %s AND user_id = %s",
                (key.organization_id, key.user_id),
            )


def measure(
    runs: Runs,
    search: FactSearch,
    requests: Sequence[tuple[MemoryKey, list[FactQuery]]],
) -> tuple[list[float], list[float]]:
    """(first calls per user, the others), in ms."""
    first: list[float] = []
    returning: list[float] = []
    seen: set[MemoryKey] = set()
    for key, queries in requests:
        runs.commit(key)
        started = time.perf_counter()
        search.related(key, queries, PER_OBSERVATION)
        elapsed = (time.perf_counter() - started) * 1000
        (returning if key in seen else first).append(elapsed)
        seen.add(key)
    return first, returning


def requests_for(
    users: Sequence[str], samples: int, observations: int, seed: int, turns: Iterator[str]
) -> list[tuple[MemoryKey, list[FactQuery]]]:
    """The same users and connections for the same seed; the texts come from `turns`, and no
    two of a stream are alike, so every call embeds its queries as a flush does."""
    rng = random.Random(seed)
    out = []
    for _ in range(samples):
        user = rng.choice(users)
        connection = rng.choice(synthetic.connection_ids(user))
        queries = [FactQuery(next(turns), connection) for _ in range(observations)]
        out.append((MemoryKey(synthetic.ORGANIZATION, user), queries))
    return out


def run(args: argparse.Namespace, per_user: Sequence[int]) -> list[Row]:
    base = Settings()
    embedder = MiniLmEmbedder(model_name=base.embedding_model)
    pool = synthetic.TextPool.embedded(args.distinct_texts, embedder, args.seed)
    rows: list[Row] = []
    with (
        services.endpoints(args, base, kafka=False) as ends,
        services.scratch_memory(base, ends, "cand", keep=args.keep) as settings,
    ):
        collection = settings.chroma.collection
        with wiring.core(settings) as c:
            population = Population.at(args.facts, per_user, args.heavy_users)
            started = time.perf_counter()
            for n, users in population.tiers.items():
                synthetic.load_users(c, users, args.seed)
                load(c, ends, collection, pool, users, range(n), args.seed)
            synthetic.analyze(c)
            print(f"{args.facts:,} facts loaded in {time.perf_counter() - started:.0f} s")
            searches: dict[str, FactSearch] = {
                "entries": wiring.candidate_search(c),
                "sql_and_chroma": HybridFactSearch(
                    c.pool, PostgresReadModel(c.pool, c.subjects), c.index, c.embedder
                ),
            }
            turns = synthetic.chat_turns(random.Random(args.seed))
            loaded = {u: n for n, users in population.tiers.items() for u in users}
            runs = Runs(c, ends, collection, pool, loaded, args)
            for n, users in sorted(population.tiers.items()):
                for name, search in searches.items():
                    asked = requests_for(
                        users, args.samples, args.observations, args.seed + n, turns
                    )
                    first, returning = measure(runs, search, asked)
                    for calls, laps in (("first", first), ("returning", returning)):
                        if laps:
                            p50, p99 = np.percentile(laps, [50, 99])
                            rows.append(Row(args.facts, n, name, calls, float(p50), float(p99)))
    return rows


def _ms(value: float) -> str:
    return f"{value:.1f} ms"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", type=int, default=40_000, help="total facts loaded")
    parser.add_argument("--facts-per-user", default="100,1000,10000", help="size tiers")
    parser.add_argument("--heavy-users", type=int, default=2, help="users per larger tier")
    parser.add_argument("--samples", type=int, default=30, help="calls per tier and search")
    parser.add_argument("--observations", type=int, default=5, help="queries per call")
    parser.add_argument("--run-facts", type=int, default=5, help="facts a run writes")
    parser.add_argument("--distinct-texts", type=int, default=2_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json-out", type=Path, help="write the rows as JSON here")
    services.add_options(parser, kafka=False)
    args = parser.parse_args(argv)
    per_user = sorted(int(s) for s in args.facts_per_user.split(","))
    Population.at(args.facts, per_user, args.heavy_users)  # refuse an impossible size first
    began = time.perf_counter()
    rows = run(args, per_user)
    print(
        markdown_table(
            ["facts", "facts/user", "search", "calls", "p50", "p99"],
            [
                [f"{r.facts:,}", f"{r.per_user:,}", r.search, r.calls, _ms(r.p50_ms), _ms(r.p99_ms)]
                for r in rows
            ],
            left=4,
        )
    )
    print(f"\nwhole bench: {time.perf_counter() - began:.0f} s")
    if args.json_out:
        document = {"rows": [r.as_json() for r in rows]}
        args.json_out.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
