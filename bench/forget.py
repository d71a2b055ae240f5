"""Seconds to forget a user: `memoryd forget` on a memory of 10k facts, on real services.

    python -m bench.forget [--facts 10000] [--repeats 3] [--background-users 20]
        [--background-facts 500] [--kafka HOST:PORT] [--dsn DSN] [--chroma-url URL] [--keep]

Loads `--repeats` memories of `--facts` facts each (the users to forget), next to
`--background-users` memories of `--background-facts` facts that stay, straight into a
scratch database and Chroma collection, as consolidation would have left them: per fact one
logged and consumed event, one fact row with its history row, its vector; per 20 facts one
run (input event ids, the applied facts as JSON, a raw response) and one ledger entry; W, S,
two connections, a credit line and 100 read-audit rows per memory. Then forgets each of the
`--repeats` memories in turn through `Eraser.forget` (tombstone on Kafka, the Postgres
transaction, the Chroma delete and its check, the sealed receipt) and reports the seconds of
each, and of asking again with the same request id (which returns the stored receipt).

Fact texts come from the read-path bench's templates; each distinct text is embedded once.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace

from psycopg.types.json import Jsonb

from bench import services
from bench.locomo.metrics import markdown_table
from bench.synthetic_memory import (
    ORGANIZATION,
    TextPool,
    index_facts,
    load_facts,
    make_facts,
    scaffold,
    working_memory,
)
from domain.codec import fact_to_json
from domain.ids import MemoryKey
from domain.model import Fact
from domain.ports import Embedder
from memoryd import wiring
from memoryd.erasure import ErasureRequest
from memoryd.ops.topics import ensure_topics
from memoryd.settings import ChromaSettings, KafkaSettings, MetricsSettings, Settings
from store.embedding_cache import CachingEmbedder
from store.embeddings import MiniLmEmbedder

FACTS_PER_RUN = 20
LOGS_PER_MEMORY = 100


def load_history(c: wiring.Core, user: str, facts: Sequence[Fact]) -> None:
    """What consolidation leaves around the facts: events, runs, history, ledger, audit rows."""
    runs = [facts[i : i + FACTS_PER_RUN] for i in range(0, len(facts), FACTS_PER_RUN)]
    run_ids = [uuid.uuid5(uuid.NAMESPACE_URL, f"{user}/run/{n}") for n in range(len(runs))]
    with c.pool.connection() as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO context_events (event_id, schema_version, user_id, organization_id,"
            " event_type, content, source, occurred_at) VALUES (%s, 1, %s, %s, 'fact', %s,"
            " 'interactive', %s)",
            [
                (f.provenance.source_event_ids[0], user, ORGANIZATION, f.content, f.created_at)
                for f in facts
            ],
        )
        cur.executemany(
            "INSERT INTO consolidated_events (event_id, run_id, organization_id, user_id)"
            " VALUES (%s, %s, %s, %s)",
            [
                (f.provenance.source_event_ids[0], run_ids[n], ORGANIZATION, user)
                for n, batch in enumerate(runs)
                for f in batch
            ],
        )
        cur.executemany(
            "INSERT INTO consolidation_runs (run_id, user_id, organization_id, input_event_ids,"
            " backend, model, prompt_version, status, base_version, output, raw_response,"
            " duration_ms, started_at) VALUES (%s, %s, %s, %s, 'offline', 'bench', 'bench',"
            " 'succeeded', %s, %s, %s, 100, now())",
            [
                (
                    run_ids[n],
                    user,
                    ORGANIZATION,
                    [f.provenance.source_event_ids[0] for f in b],
                    n,
                    Jsonb({"applied": {"facts": [fact_to_json(f) for f in b]}}),
                    "\n".join(f.content for f in b),
                )
                for n, b in enumerate(runs)
            ],
        )
        cur.executemany(
            "INSERT INTO fact_history (fact_id, run_id, operation, after)"
            " VALUES (%s, %s, 'add', %s)",
            [
                (f.fact_id, run_ids[n], Jsonb(fact_to_json(f)))
                for n, batch in enumerate(runs)
                for f in batch
            ],
        )
        cur.executemany(
            "INSERT INTO credit_ledger (entry_id, user_id, organization_id, run_id, operation,"
            " model, units, cost_micro_usd, occurred_at)"
            " VALUES (gen_random_uuid(), %s, %s, %s, 'llm', 'bench', 1000, 300, now())",
            [(user, ORGANIZATION, r) for r in run_ids],
        )
        cur.executemany(
            "INSERT INTO context_logs (log_id, user_id, organization_id, query, memory_version,"
            " injected, retrieved, latency_ms, degraded) VALUES (gen_random_uuid(), %s, %s, %s,"
            " 1, '{}', %s, 20, false)",
            [
                (user, ORGANIZATION, f"about {f.content}", Jsonb([{"fact_id": str(f.fact_id)}]))
                for f in facts[:LOGS_PER_MEMORY]
            ],
        )


def load_memory(c: wiring.Core, user: str, seed: int) -> None:
    rng = random.Random(f"{seed}:memory:{user}")
    with c.pool.connection() as conn:
        conn.execute(
            "INSERT INTO user_memory (organization_id, user_id, working_memory,"
            " information_scaffold, persistent_learned_info, version) VALUES (%s, %s, %s, %s,"
            " '[]', %s)",
            (ORGANIZATION, user, working_memory(user, rng), Jsonb(scaffold(rng)), 1),
        )
        for connection in ("mail", "chat"):
            conn.execute(
                "INSERT INTO connections (organization_id, user_id, connection_id,"
                " persistent_learned_info) VALUES (%s, %s, %s, %s)",
                (ORGANIZATION, user, f"{user}-{connection}", Jsonb([f"{user} uses {connection}"])),
            )
    c.memory.set_credit(MemoryKey(ORGANIZATION, user), 10_000_000)


# Distinct texts embedded once; facts are perturbed copies of their vectors (as in bench.read_path).
DISTINCT_TEXTS = 4_000


def load(
    c: wiring.Core,
    chroma_url: str,
    collection: str,
    users: Sequence[str],
    per_user: int,
    pool: TextPool,
    seed: int,
    embedder: Embedder,
) -> None:
    for user in users:
        facts, vectors = make_facts(pool, user, range(per_user), seed)
        # The read-path bench's facts share one run per user; here runs are per 20 facts.
        run = uuid.uuid5(uuid.NAMESPACE_URL, user)
        facts = [replace(f, created_by_run=run) for f in facts]
        load_facts(c, facts)
        load_memory(c, user, seed)
        load_history(c, user, facts)
        index_facts(chroma_url, collection, embedder, facts, vectors)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", type=int, default=10_000, help="facts of each forgotten user")
    parser.add_argument("--repeats", type=int, default=3, help="users forgotten, one by one")
    parser.add_argument("--background-users", type=int, default=20)
    parser.add_argument("--background-facts", type=int, default=500)
    parser.add_argument("--seed", type=int, default=7)
    services.add_options(parser, kafka=True)
    args = parser.parse_args(argv)
    began = time.perf_counter()
    base = Settings()
    embedder = CachingEmbedder(MiniLmEmbedder(model_name=base.embedding_model))
    pool = TextPool.embedded(DISTINCT_TEXTS, embedder, args.seed)
    forgotten = [f"forget-{i}" for i in range(args.repeats)]
    background = [f"stay-{i}" for i in range(args.background_users)]
    with services.endpoints(args, base, kafka=True) as ends:
        run = services.run_id()
        topics = [f"bench-forget-{run}", f"bench-forget-{run}.dlq"]
        stores = services.scratch_stores(ends, "forget", run, topics, keep=args.keep)
        with stores as (dsn, collection):
            settings = base.model_copy(
                update={
                    "kafka": KafkaSettings(
                        bootstrap_servers=ends.kafka_bootstrap,
                        topic=topics[0],
                        dead_letter_topic=topics[1],
                        partitions=6,
                    ),
                    "postgres": base.postgres.model_copy(update={"dsn": dsn}),
                    "chroma": ChromaSettings(
                        mode="http", url=ends.chroma_url, collection=collection
                    ),
                    "metrics": MetricsSettings(enabled=False),
                }
            )
            ensure_topics(settings)
            with wiring.core(settings) as c:
                started = time.perf_counter()
                load(
                    c,
                    ends.chroma_url,
                    collection,
                    background,
                    args.background_facts,
                    pool,
                    args.seed,
                    embedder,
                )
                load(
                    c, ends.chroma_url, collection, forgotten, args.facts, pool, args.seed, embedder
                )
                load_s = time.perf_counter() - started
                results = forget_each(c, forgotten)
    print(_report(args, results, load_s, time.perf_counter() - began))


def forget_each(
    c: wiring.Core, users: Sequence[str]
) -> list[tuple[float, float, dict[str, object]]]:
    """(seconds to forget, seconds to ask again, the receipt's counts) per user."""
    out = []
    pub = wiring.publisher(c.settings)
    try:
        eraser = wiring.eraser(c, pub)
        for user in users:
            key = MemoryKey(ORGANIZATION, user)
            request = ErasureRequest("bench", "bench", f"bench-{user}")
            started = time.perf_counter()
            receipt = eraser.forget(key, request)
            took = time.perf_counter() - started
            started = time.perf_counter()
            again = eraser.forget(key, request)
            again_s = time.perf_counter() - started
            if again != receipt or c.index.count(key) != 0:
                raise SystemExit(f"forgetting {user} did not hold: {receipt} / {again}")
            out.append((took, again_s, dict(receipt.removed)))
    finally:
        pub.close()
    return out


def _report(
    args: argparse.Namespace,
    results: Sequence[tuple[float, float, dict[str, object]]],
    load_s: float,
    total_s: float,
) -> str:
    removed = results[0][2]
    postgres = removed["postgres"]
    assert isinstance(postgres, dict)
    counts = ", ".join(f"{t} {n:,}" for t, n in sorted(postgres.items()))
    table = markdown_table(
        ["forgotten user", "facts", "seconds to forget", "asked again (same request id)"],
        [
            [f"forget-{i}", f"{args.facts:,}", f"{s:.2f} s", f"{again * 1000:.0f} ms"]
            for i, (s, again, _) in enumerate(results)
        ],
    )
    took = [s for s, _, _ in results]
    return "\n".join(
        [
            (
                f"{args.repeats} memories of {args.facts:,} facts forgotten one by one, next to "
                f"{args.background_users} memories of {args.background_facts:,} facts that stay."
            ),
            "",
            table,
            "",
            (
                f"Median {statistics.median(took):.2f} s, min {min(took):.2f} s,"
                f" max {max(took):.2f} s."
            ),
            (
                f"Rows removed per memory: {counts}; ledger entries anonymised:"
                f" {removed['anonymised']}; vectors: {removed['chroma']}."
            ),
            (
                f"Loading took {load_s:.0f} s; whole bench {total_s:.0f} s; load average at the "
                f"end {'/'.join(f'{x:.1f}' for x in os.getloadavg())} (1/5/15 min) on "
                f"{os.cpu_count()} CPUs."
            ),
        ]
    )


if __name__ == "__main__":
    main()
