"""LoCoMo retrieval: memoryd (real pipeline, offline backend) against two raw-turn baselines.

    python -m bench.locomo PATH [--limit-conversations N] [--max-questions N]
        [--json-out FILE] [--kafka HOST:PORT] [--dsn DSN] [--chroma-url URL] [--keep]

Ingests the `conversation` part of each sample through Kafka, the log writer and the
MemoryProcessor, asks every question of categories 1-4 through `ContextService.assemble`
(budget deep), and prints Markdown tables of hit@k and evidence recall@k for k = 1, 3, 5, 10
and of hit within 2,000 characters of returned text, per category and overall, next to BM25
and dense search over the raw turns; `--json-out` also writes the figures as JSON. PATH may be
LoCoMo's format or LongMemEval's (told apart by their keys). Services: see bench/services.py
(options, MEMORYD_* settings, else local ones started for the run).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

from bench import services
from bench.locomo.baselines import Bm25Turns, DenseTurns
from bench.locomo.dataset import Conversation, Notes, Question, load
from bench.locomo.ingest import IngestReport, Retrieval, ask, ingest
from bench.locomo.metrics import (
    BUDGET_CHARS,
    KS,
    OVERALL,
    Answer,
    Summary,
    markdown_table,
    metric_table,
    summarize,
)
from memoryd.settings import ChromaSettings, KafkaSettings, MetricsSettings, Settings
from store.embedding_models import ModelName
from store.embeddings import MiniLmEmbedder

MEMORYD = "memoryd (deep)"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, help="a LoCoMo-format JSON file")
    parser.add_argument("--limit-conversations", type=int, metavar="N")
    parser.add_argument(
        "--max-questions", type=int, metavar="N", help="ask at most N questions per conversation"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        help="ingest deadline, seconds (default: an hour, plus 2 s a turn past 1,800 turns)",
    )
    parser.add_argument("--json-out", type=Path, metavar="FILE", help="also write JSON here")
    services.add_options(parser, kafka=True)
    args = parser.parse_args(argv)

    began = time.perf_counter()
    loaded = load(args.path, args.limit_conversations)
    # Nothing to ingest or search in a conversation without a turn (its questions neither).
    conversations = [c for c in loaded if c.turns]
    if not conversations:
        raise SystemExit(f"bench.locomo: {args.path} holds no conversation with a turn")
    per_conversation = None if args.max_questions is None else max(0, args.max_questions)
    questions = [q for c in conversations for q in c.questions[:per_conversation]]
    turns = sum(len(c.turns) for c in conversations)
    timeout = args.timeout or 3600.0 + 2.0 * max(0, turns - 1_800)
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
            report = ingest(settings, conversations, timeout)
            retrievals = ask(settings, questions, max(KS))
    baselines = _baselines(conversations, questions, base.embedding_model)
    empty = len(loaded) - len(conversations)
    print(_report(args.path, settings, loaded, questions, report, retrievals, baselines, empty))
    if args.json_out is not None:
        document = json_summary(report, retrievals)
        args.json_out.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")
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
    conversations: Sequence[Conversation], questions: Sequence[Question], model: ModelName
) -> list[Answer]:
    # The dense baseline embeds with the graph memoryd indexes with.
    embedder = MiniLmEmbedder(model_name=model)
    answers = []
    for conv in conversations:
        asked = [q for q in questions if q.sample_id == conv.sample_id]
        size = {t.dia_id: len(t.content) for t in conv.turns}
        for system in (Bm25Turns(conv.turns), DenseTurns(conv.turns, embedder)):
            for q in asked:
                # Enough turns to fill the character budget, not only the top k.
                found = system.search(q.question, len(conv.turns))
                ranked = tuple(frozenset({t}) for t in found)
                sizes = tuple(size[t] for t in found)
                answers.append(Answer(system.name, q.category, q.evidence, ranked, sizes))
    return answers


def _percent(value: float) -> float:
    return round(100 * value, 1)


def _figures(s: Summary) -> dict[str, float]:
    return {
        f"hit@{BUDGET_CHARS}ch": _percent(s.hit_budget),
        **{f"hit@{k}": _percent(s.hit[k]) for k in KS},
        f"recall@{max(KS)}": _percent(s.recall[max(KS)]),
    }


def json_summary(report: IngestReport, retrievals: Sequence[Retrieval]) -> dict[str, object]:
    """memoryd's figures as one JSON object; percentages are 0-100."""
    answers = [
        Answer(MEMORYD, r.question.category, r.question.evidence, r.ranked, r.sizes)
        for r in retrievals
    ]
    summaries = summarize(answers)
    overall = next((s for s in summaries if s.group == OVERALL), None)
    latencies = sorted(r.latency_ms for r in retrievals)
    active = report.facts_by_status.get("active", 0)
    return {
        "questions": len(retrievals),
        "turns": report.turns,
        "facts_active": active,
        "facts_per_turn": round(active / max(1, report.turns), 3),
        "ingest_s": round(report.total_s, 1),
        # No question asked (a file of unscored questions): no figure, not a figure of 0.
        "overall": {} if overall is None else _figures(overall),
        "by_category": {
            s.group: {"questions": s.questions, **_figures(s)}
            for s in summaries
            if s.group != OVERALL
        },
        "assemble_p50_ms": round(_quantile(latencies, 0.5), 1),
        "assemble_p99_ms": round(_quantile(latencies, 0.99), 1),
        # Where the time goes: each stage of assemble, p50 and p99 over the questions.
        "assemble_stages_ms": {
            stage: {
                "p50": round(_quantile(times, 0.5), 1),
                "p99": round(_quantile(times, 0.99), 1),
            }
            for stage, times in _stage_times(retrievals).items()
        },
    }


def _stage_times(retrievals: Sequence[Retrieval]) -> dict[str, list[float]]:
    stages: dict[str, list[float]] = {}
    for r in retrievals:
        for stage, ms in r.stages_ms.items():
            stages.setdefault(stage, []).append(ms)
    return {stage: sorted(times) for stage, times in stages.items()}


def _quantile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of sorted values."""
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def _report(
    path: Path,
    settings: Settings,
    conversations: Sequence[Conversation],
    questions: Sequence[Question],
    ingest_report: IngestReport,
    retrievals: Sequence[Retrieval],
    baselines: Sequence[Answer],
    empty: int = 0,
) -> str:
    answers = [
        Answer(MEMORYD, r.question.category, r.question.evidence, r.ranked, r.sizes)
        for r in retrievals
    ]
    summaries = summarize([*answers, *baselines])
    systems = [MEMORYD, Bm25Turns.name, DenseTurns.name]
    skipped, notes = Notes(), Notes()
    for conv in conversations:
        for reason, n in conv.skipped.items():
            skipped.add(reason, n)
        for reason, n in conv.turn_notes.items():
            notes.add(reason, n)
    if empty:
        notes.add("conversation without a turn (left out)", empty)
    r = ingest_report
    short = sum(1 for x in retrievals if x.facts_returned < max(KS))
    latencies = sorted(x.latency_ms for x in retrievals) or [0.0]
    degraded = sum(1 for x in retrievals if x.degraded)
    p = settings.processor
    names = [c.sample_id for c in conversations]
    shown = ", ".join(names[:20]) + (f", … ({len(names) - 20} more)" if len(names) > 20 else "")
    sections = [
        f"File `{path.name}`: {len(conversations)} conversation(s) ({shown}), "
        f"{len(questions)} question(s) of the scored categories asked; not asked: "
        + ", ".join(f"{n} {reason}" for reason, n in skipped.items())
        + "."
        + ("" if not notes else " Not ingested as given: ")
        + ", ".join(f"{n} {reason}" for reason, n in notes.items())
        + (
            f" {degraded} bundle(s) degraded (vector index away) after retries." if degraded else ""
        ),
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
                [
                    "active facts per turn",
                    f"{r.facts_by_status.get('active', 0) / max(1, r.turns):.2f}",
                ],
                ["publish time", f"{r.publish_s:.1f} s"],
                ["ingest time (publish → all consolidated and indexed)", f"{r.total_s:.1f} s"],
            ],
        ),
        "",
        (
            "Retrieval: each returned fact stands for the turns behind it (its source events); "
            f"{short} of {len(retrievals)} bundles held fewer than {max(KS)} facts; "
            f"assemble latency p50 {_quantile(latencies, 0.5):.0f} ms, "
            f"p99 {_quantile(latencies, 0.99):.0f} ms, max {latencies[-1]:.0f} ms."
        ),
        "",
        (
            f"hit within {BUDGET_CHARS:,} characters (any evidence turn behind the facts, or turns,"
            f" that fit in rank order in {BUDGET_CHARS:,} characters of their text):"
        ),
        "",
        _budget_table(summaries, systems),
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


def _budget_table(summaries: Sequence[Summary], systems: Sequence[str]) -> str:
    by_key = {(s.group, s.system): s for s in summaries}
    rows = [
        [s.group, system, s.questions, f"{100 * s.hit_budget:.1f} %"]
        for group in dict.fromkeys(x.group for x in summaries)
        for system in systems
        if (s := by_key.get((group, system))) is not None
    ]
    return markdown_table(["category", "system", "questions", "hit@2000ch"], rows, left=2)


if __name__ == "__main__":
    main()
