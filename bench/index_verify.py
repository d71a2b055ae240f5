"""`memoryd index-verify` over a loaded memory: what the check and the repair cost.

    python -m bench.index_verify [--facts 100000] [--facts-per-user 100] [--lose 1000]
        [--json-out FILE] [services options]

Loads synthetic memory (`bench.synthetic_memory`, as `bench.api` loads it) into a scratch
database and Chroma collection, every fact marked indexed, then times the check
(`consumers.index_check`) in four phases: a dry run over the consistent index; after
deleting `--lose` vectors from Chroma and writing `--lose` vectors of facts no row holds, a
dry run and then the repair; and a dry run after it, which must find nothing. The repair
embeds the lost facts' texts again (the model's vectors, where the load wrote synthetic ones).

Each phase's time is also split by the calls it made (`calls` in the JSON: seconds per port
method, e.g. `ids_page` for the second pass's listing of Chroma's ids), to see which pass grows
with the collection.

`--json-out FILE` writes {"facts": n, "rows": [{"phase": ..., "seconds": x, "indexed": n,
"absent": n, "differing": n, "repaired": n, "held": n, "orphans": n, "removed": n,
"calls": {method: seconds}}]}.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path

from bench import services
from bench import synthetic_memory as synthetic
from bench.locomo.metrics import markdown_table
from bench.read_path import Population, load
from consumers.index_check import IndexCheck, IndexChecker
from domain.ids import MemoryKey, fact_id_for
from domain.model import Fact
from domain.ports import IndexContents, IndexedFacts, StoredFact
from memoryd import wiring
from memoryd.settings import Settings
from store.embeddings import MiniLmEmbedder

COLUMNS = ("indexed", "absent", "differing", "repaired", "held", "orphans", "removed")
# `upsert` runs inside `repair`: its seconds are counted in both.
CALLS = ("indexed_after", "stored", "repair", "upsert", "ids_page", "missing_facts", "delete")


class CallTimes:
    """Seconds spent in each port method, summed."""

    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)

    @contextmanager
    def timing(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - started


class TimedFacts:
    def __init__(self, facts: IndexedFacts, times: CallTimes) -> None:
        self._facts = facts
        self._times = times

    def indexed_after(self, after: uuid.UUID | None, limit: int) -> list[Fact]:
        with self._times.timing("indexed_after"):
            return self._facts.indexed_after(after, limit)

    def repair(
        self, fact_ids: Sequence[uuid.UUID], write: Callable[[Sequence[Fact]], object]
    ) -> list[Fact]:
        with self._times.timing("repair"):
            return self._facts.repair(fact_ids, write)

    def missing_facts(self, fact_ids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
        with self._times.timing("missing_facts"):
            return self._facts.missing_facts(fact_ids)


class TimedContents:
    def __init__(self, index: IndexContents, times: CallTimes) -> None:
        self._index = index
        self._times = times

    def stored(self, fact_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, StoredFact]:
        with self._times.timing("stored"):
            return self._index.stored(fact_ids)

    def ids_page(self, offset: int, limit: int) -> list[str]:
        with self._times.timing("ids_page"):
            return self._index.ids_page(offset, limit)

    def upsert(self, facts: Sequence[Fact]) -> int:
        with self._times.timing("upsert"):
            return self._index.upsert(facts)

    def delete(self, fact_ids: Sequence[uuid.UUID]) -> None:
        with self._times.timing("delete"):
            self._index.delete(fact_ids)


def damage(c: wiring.Core, chroma_url: str, collection: str, lose: int) -> None:
    """`lose` vectors deleted, and as many written for facts of users no row holds."""
    with c.pool.connection() as conn:
        rows = conn.execute(
            "SELECT fact_id FROM memory_facts ORDER BY md5(fact_id::text) LIMIT %s", (lose,)
        ).fetchall()
    lost = c.memory.facts_by_id([r[0] for r in rows])
    c.index.delete([f.fact_id for f in lost])
    ghosts = []
    for fact in lost:
        erased = MemoryKey(fact.organization_id, f"erased-{fact.user_id}")
        fact_id = fact_id_for(erased, fact.content, fact.provenance.connection_id)
        ghosts.append(replace(fact, fact_id=fact_id, user_id=erased.user_id))
    vectors = c.embedder.embed([g.content for g in ghosts])
    synthetic.index_facts(chroma_url, collection, c.embedder, ghosts, vectors)


Phase = tuple[str, float, IndexCheck, dict[str, float]]


def run(args: argparse.Namespace) -> tuple[list[Phase], str]:
    base = Settings()
    population = Population.at(args.facts, [args.facts_per_user], 0)
    embedder = MiniLmEmbedder(model_name=base.embedding_model)
    pool = synthetic.TextPool.embedded(args.distinct_texts, embedder, args.seed)
    phases: list[Phase] = []
    with (
        services.endpoints(args, base, kafka=False) as ends,
        services.scratch_memory(base, ends, "index_verify", keep=args.keep) as settings,
        wiring.core(settings) as c,
    ):
        collection = settings.chroma.collection
        started = time.perf_counter()
        for n, users in population.tiers.items():
            synthetic.load_users(c, users, args.seed)
            load(c, ends, collection, pool, users, range(n), args.seed)
        synthetic.analyze(c)
        load_s = time.perf_counter() - started

        def timed(phase: str, repair: bool) -> None:
            times = CallTimes()
            checker = IndexChecker(
                TimedFacts(wiring.indexed_facts(c), times), TimedContents(c.index, times)
            )
            started = time.perf_counter()
            result = checker.check(repair=repair)
            phases.append((phase, time.perf_counter() - started, result, dict(times.seconds)))

        timed("consistent, dry run", False)
        damage(c, ends.chroma_url, collection, args.lose)
        timed("damaged, dry run", False)
        timed("damaged, repair", True)
        timed("repaired, dry run", False)
    note = f"{args.facts:,} facts ({args.facts_per_user} per user), loaded in {load_s:.0f} s"
    return phases, note


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", type=int, default=100_000)
    parser.add_argument("--facts-per-user", type=int, default=100)
    parser.add_argument("--lose", type=int, default=1_000, help="vectors lost, orphans added")
    parser.add_argument("--distinct-texts", type=int, default=4_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json-out", type=Path)
    services.add_options(parser, kafka=False)
    args = parser.parse_args(argv)
    phases, note = run(args)
    print(note)
    print()
    print(
        markdown_table(
            ["phase", "seconds", *COLUMNS],
            [
                [phase, f"{seconds:.1f}", *(f"{asdict(r)[k]:,}" for k in COLUMNS)]
                for phase, seconds, r, _ in phases
            ],
        )
    )
    print()
    print("seconds in each call (`upsert` runs inside `repair`):")
    print(
        markdown_table(
            ["phase", *CALLS],
            [
                [phase, *(f"{calls.get(k, 0.0):.1f}" for k in CALLS)]
                for phase, _, _, calls in phases
            ],
        )
    )
    if args.json_out:
        rows = [
            {
                "phase": phase,
                "seconds": round(seconds, 3),
                **{k: asdict(r)[k] for k in COLUMNS},
                "calls": {k: round(v, 3) for k, v in sorted(calls.items())},
            }
            for phase, seconds, r, calls in phases
        ]
        args.json_out.write_text(json.dumps({"facts": args.facts, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
