"""LoCoMo retrieval: memoryd (real pipeline, offline backend) against two raw-turn baselines.

    python -m bench.locomo PATH [--limit-conversations N] [--max-questions N]
        [--kafka HOST:PORT] [--dsn DSN] [--chroma-url URL] [--keep]

Ingests the `conversation` part of each sample through Kafka, the log writer and the
MemoryProcessor, asks every question of categories 1-4 through `ContextService.assemble`
(budget deep), and prints Markdown tables of hit@k and evidence recall@k for k = 1, 3, 5, 10,
per category and overall, next to BM25 and dense search over the raw turns. Services: see
bench/services.py (options, MEMORYD_* settings, else local ones started for the run).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from pathlib import Path

from bench import services
from bench.locomo.baselines import Bm25Turns, DenseTurns
from bench.locomo.dataset import Conversation, Question, load
from bench.locomo.ingest import IngestReport, Retrieval, ask, ingest
from bench.locomo.metrics import KS, OVERALL, Answer, markdown_table, metric_table, summarize
from memoryd.settings import ChromaSettings, KafkaSettings, MetricsSettings, Settings
from store.embeddings import MiniLmEmbedder

MEMORYD = "memoryd (deep)"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, help="a LoCoMo-format JSON file")
    parser.add_argument("--limit-conversations", type=int, metavar="N")
    parser.add_argument(
        "--max-questions", type=int, metavar="N", help="ask at most N questions per conversation"
    )
    parser.add_argument("--timeout", type=float, default=3600.0, help="ingest deadline, seconds")
    services.add_options(parser, kafka=True)
    args = parser.parse_args(argv)

    began = time.perf_counter()
    conversations = load(args.path, args.limit_conversations)
    questions = [q for c in conversations for q in c.questions[: args.max_questions]]
    base = Settings()
    with services.endpoints(args, base, kafka=True) as ends:
        run = services.run_id()
        with (
            services.scratch_database(ends.postgres_dsn, "bench_locomo", keep=args.keep) as dsn,
            services.scratch_topics(ends.kafka_bootstrap, topic_names(run), keep=args.keep),
            services.scratch_collection(
                ends.chroma_url, f"bench_locomo_{run}", keep=args.keep
            ) as collection,
        ):
            settings = _settings(base, ends, dsn, collection, run)
            report = ingest(settings, conversations, args.timeout)
            retrievals = ask(settings, questions, max(KS))
    baselines = _baselines(conversations, questions)
    print(_report(args.path, settings, conversations, questions, report, retrievals, baselines))
    average = "/".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"\nWhole bench: {time.perf_counter() - began:.0f} s; load average at the end {average} "
        f"(1/5/15 min) on {os.cpu_count()} CPUs."
    )


def topic_names(run: str) -> list[str]:
    return [f"bench-locomo-{run}", f"bench-locomo-{run}.dlq"]


def _settings(
    base: Settings, ends: services.Endpoints, dsn: str, collection: str, run: str
) -> Settings:
    """The run's own topics, groups, database and collection; the rest as configured."""
    return base.model_copy(
        update={
            "kafka": KafkaSettings(
                **{
                    **base.kafka.model_dump(),
                    "bootstrap_servers": ends.kafka_bootstrap,
                    "topic": topic_names(run)[0],
                    "dead_letter_topic": topic_names(run)[1],
                    "log_writer_group": f"bench-locomo-log-{run}",
                    "processor_group": f"bench-locomo-proc-{run}",
                }
            ),
            "postgres": base.postgres.model_copy(update={"dsn": dsn}),
            "chroma": ChromaSettings(mode="http", url=ends.chroma_url, collection=collection),
            "metrics": MetricsSettings(enabled=False),
        }
    )


def _baselines(
    conversations: Sequence[Conversation], questions: Sequence[Question]
) -> list[Answer]:
    embedder = MiniLmEmbedder()
    k = max(KS)
    answers = []
    for conv in conversations:
        asked = [q for q in questions if q.sample_id == conv.sample_id]
        for system in (Bm25Turns(conv.turns), DenseTurns(conv.turns, embedder)):
            for q in asked:
                ranked = tuple(frozenset({t}) for t in system.search(q.question, k))
                answers.append(Answer(system.name, q.category, q.evidence, ranked))
    return answers


def _report(
    path: Path,
    settings: Settings,
    conversations: Sequence[Conversation],
    questions: Sequence[Question],
    ingest_report: IngestReport,
    retrievals: Sequence[Retrieval],
    baselines: Sequence[Answer],
) -> str:
    answers = [
        Answer(MEMORYD, r.question.category, r.question.evidence, r.ranked) for r in retrievals
    ]
    summaries = summarize([*answers, *baselines])
    systems = [MEMORYD, Bm25Turns.name, DenseTurns.name]
    skipped: dict[str, int] = {}
    for conv in conversations:
        for reason, n in conv.skipped.items():
            skipped[reason] = skipped.get(reason, 0) + n
    r = ingest_report
    short = sum(1 for x in retrievals if x.facts_returned < max(KS))
    latencies = sorted(x.latency_ms for x in retrievals)
    p = settings.processor
    sections = [
        f"LoCoMo file `{path.name}`: {len(conversations)} conversation(s) "
        f"({', '.join(c.sample_id for c in conversations)}), {len(questions)} question(s) of "
        f"categories 1-4 asked; not asked: "
        + ", ".join(f"{n} {reason}" for reason, n in skipped.items())
        + ".",
        (
            f"Backend `{settings.llm.backend}`, processor max_batch {p.max_batch}, "
            f"max_wait {p.max_wait_s} s, concurrency {p.concurrency}."
        ),
        "",
        "Ingest:",
        "",
        markdown_table(
            ["measure", "value"],
            [
                ["turns ingested (events)", r.turns],
                ["events in the log", r.events_logged],
                ["consolidation runs", r.runs],
                ["facts stored (all statuses)", sum(r.facts_by_status.values())],
                *([f"facts {status}", n] for status, n in sorted(r.facts_by_status.items())),
                ["active facts per turn", f"{r.facts_by_status.get('active', 0) / r.turns:.2f}"],
                ["publish time", f"{r.publish_s:.1f} s"],
                ["ingest time (publish → all consolidated and indexed)", f"{r.total_s:.1f} s"],
            ],
        ),
        "",
        (
            "Retrieval: each returned fact stands for the turns behind it (its source events); "
            f"{short} of {len(retrievals)} bundles held fewer than {max(KS)} facts; "
            f"assemble latency p50 {latencies[len(latencies) // 2]:.0f} ms, "
            f"max {latencies[-1]:.0f} ms."
        ),
        "",
        "hit@k (any evidence turn among the turns behind the top k):",
        "",
        metric_table(summaries, "hit", systems),
        "",
        "evidence recall@k (fraction of the evidence turns behind the top k):",
        "",
        metric_table(summaries, "recall", systems),
        "",
        "Mean number of distinct turns behind the top k (a baseline returns one per position):",
        "",
        metric_table([s for s in summaries if s.group == OVERALL], "turns", systems, digits=1),
    ]
    return "\n".join(sections)


if __name__ == "__main__":
    main()
