"""Embedder throughput and latency on this machine.

    python -m bench.embeddings [--model NAME] [--threads N] [--queries 200]

Prints a Markdown table: model load time, texts/s for calls of 1, 32 and 256 fact-length
texts, and single-query latency p50/p99. The texts are generated deterministically from fact
templates (5 to 40 words, like consolidated facts), so runs are comparable.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time
from collections.abc import Sequence

import numpy as np

from store.embedding_models import MODEL_NAMES, ModelName
from store.embeddings import MODEL_NAME, MiniLmEmbedder

SUBJECTS = [
    "The user",
    "Their manager",
    "The user's partner",
    "The payments team",
    "Their startup",
]
PREDICATES = [
    "lives in {city} and commutes by bike",
    "prefers concise answers with code examples",
    "is migrating the {project} service from Postgres 12 to 16 before the end of {month}",
    "asked to be reminded about the {project} design review on {month} 14",
    "dislikes long meetings and blocks focus time every morning",
    "is planning a trip to {city} in {month} and wants quiet hotels near the old town",
    "uses {tool} for sprint planning and {tool} for incident tracking",
    "mentioned that the {project} launch slipped because vendor contracts were late",
    "is learning Rust in the evenings and reads one chapter of the book per week",
    "has a cat named Miso",
]
FILL = {
    "city": ["Berlin", "Lisbon", "Kyoto", "Toronto", "Nairobi"],
    "project": ["billing", "search", "onboarding", "ledger", "notifications"],
    "month": ["March", "April", "September", "November"],
    "tool": ["Jira", "Linear", "Notion", "PagerDuty"],
}
TAILS = [
    "",
    "; this came up twice in the last week",
    ", and they want the assistant to keep track of follow-ups on it across sessions",
]


def fact_texts(count: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        predicate = rng.choice(PREDICATES)
        for key, values in FILL.items():
            while "{" + key + "}" in predicate:
                predicate = predicate.replace("{" + key + "}", rng.choice(values), 1)
        texts.append(f"{rng.choice(SUBJECTS)} {predicate}{rng.choice(TAILS)}.")
    return texts


def measure_load(model: ModelName, threads: int, repeats: int = 3) -> float:
    """Median seconds for hash check + tokenizer + ONNX session, on a fresh embedder."""
    times = []
    for _ in range(repeats):
        embedder = MiniLmEmbedder(model_name=model, threads=threads)
        started = time.perf_counter()
        embedder.load()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def throughput(
    embedder: MiniLmEmbedder, texts: Sequence[str], call_size: int, repeats: int = 3
) -> float:
    """Texts per second when the caller hands over call_size texts per embed call.

    The median of a few runs: the machines this runs on are shared, and one busy neighbour
    during a single run would otherwise decide the number.
    """
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        for start in range(0, len(texts), call_size):
            embedder.embed(texts[start : start + call_size])
        rates.append(len(texts) / (time.perf_counter() - started))
    return statistics.median(rates)


def query_latencies_ms(embedder: MiniLmEmbedder, queries: Sequence[str]) -> list[float]:
    latencies = []
    for query in queries:
        started = time.perf_counter()
        embedder.embed([query])
        latencies.append((time.perf_counter() - started) * 1000)
    return latencies


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=MODEL_NAMES, default=MODEL_NAME, help="the graph")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="cores a call may use (MEMORYD_EMBEDDING_THREADS), 0 = one per core",
    )
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args(argv)

    load_s = measure_load(args.model, args.threads)
    embedder = MiniLmEmbedder(model_name=args.model, threads=args.threads)
    embedder.load()
    texts = fact_texts(1024)
    embedder.embed(texts[:64])  # warm-up: first runs allocate ORT's arenas

    rows: list[tuple[str, str]] = [
        ("model load (hash check, rewrite if any, tokenizer, session)", f"{load_s:.2f} s")
    ]
    for call_size, total in ((1, 256), (32, 1024), (256, 1024)):
        rate = throughput(embedder, texts[:total], call_size)
        rows.append((f"throughput, {call_size} text(s) per call", f"{rate:,.0f} texts/s"))
    latencies = query_latencies_ms(embedder, fact_texts(args.queries, seed=11))
    p50, p99 = np.percentile(latencies, [50, 99])
    rows.append((f"single-query latency p50 ({args.queries} queries)", f"{p50:.2f} ms"))
    rows.append((f"single-query latency p99 ({args.queries} queries)", f"{p99:.2f} ms"))

    words = [len(t.split()) for t in texts]
    load_1m, _, _ = os.getloadavg()
    print(
        f"Embedder {embedder.model_name}, threads {args.threads or 'one per core'}, "
        f"{os.cpu_count()} CPUs ({platform.machine()}), load average {load_1m:.1f} at the end; "
        f"texts of {min(words)}-{max(words)} words (mean {statistics.mean(words):.0f})\n"
    )
    print("| measure | value |")
    print("|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    main()
