"""MemoryProcessor overhead and throughput on real Kafka, Postgres and Chroma.

    python -m bench.processor [--users 32] [--events 5] [--latency-ms 500]
        [--concurrency 1,4,16] [--history 0] [--kafka HOST:PORT] [--dsn DSN]
        [--chroma-url URL] [--keep]

A fake LLM backend answers every consolidation after a fixed latency (500 ms by default)
with a small, valid answer: a working memory, a scaffold and one fact per observation (two
at most). For each concurrency, `--users` users each publish `--events` observations to a
fresh topic (batches are exactly one user's events), and a processor with that many
concurrent consolidations runs until every event is consolidated and every fact indexed.
With `--history N`, each user first has N batches of other observations consolidated and
indexed, unmeasured: the measured batch then meets a memory with facts, as a returning user's
does (its candidate search embeds the observations and scores the stored vectors; the gate
compares the proposals with stored facts). Without it every measured flush is a first one.

Reported per concurrency:
- users/s: users / wall time from the first publish to the last fact indexed, with the
  processor already in its group (joining is not counted); "ideal" is what the fake LLM
  alone would allow (concurrency / latency);
- overhead per batch: the processor's mean flush time (memory lock, reads, the backend call,
  gate, planning, one Postgres transaction: `memoryd_flush_seconds`) minus the backend's
  own mean call time; per event: the same divided by the batch size;
- indexing, which runs after the flush in one background thread per processor, coalescing
  finished runs: how many writes it took and their mean time (embedding, Chroma upsert,
  marking the facts indexed), timed around `FactIndexer.index_ids`; it is in the wall time;
- CPU per event: the CPU time of every thread of this process but the bench's own (its main
  thread publishes the events and polls Postgres for the end), from the first publish to the
  last fact indexed, divided by the events: the flushes, the indexer, the model's threads,
  the consumer's and the publisher's IO threads (the last at most 0.05 ms an event: a whole
  producer's CPU in `bench.ingest`), and what the processor spends while it waits between
  batches. What a core consolidates per second, the LLM aside.

Services come from options, `MEMORYD_*` settings, or are started locally (bench.services).
Every run writes to a scratch database, topics and collection of its own.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import psycopg

from bench import services
from consumers.indexer import FactIndexer
from consumers.settings import ProcessorSettings
from domain.model import FactType, TokenUsage
from memoryd import wiring
from memoryd.ops.topics import ensure_topics
from memoryd.settings import (
    ChromaSettings,
    KafkaSettings,
    MetricsSettings,
    PostgresSettings,
    Settings,
)
from processors.schema import (
    BackendResponse,
    ConsolidationOutput,
    ConsolidationRequest,
    FactProposal,
)
from producers.contract import (
    ContextEvent,
    EventType,
    Source,
    SourceMetadata,
    new_event_id,
    utc_now,
)

PARTITIONS = 6
SUBJECTS = (
    "the Falcon launch",
    "the billing API",
    "hiring a designer",
    "the Q3 report",
    "moving to Lisbon",
    "the design review",
    "a marathon in May",
    "the onboarding docs",
)
HEADER = (
    "| concurrent consolidations | users/s | ideal users/s | wall (s) | peak LLM calls in flight"
    " | flush mean (ms) | LLM mean (ms) | overhead / batch (ms) | overhead / event (ms)"
    " | index writes | index write mean (ms) | CPU / event (ms) |"
)


@dataclass
class FixedLatencyBackend:
    """A `ConsolidationBackend` that takes `latency_s` per call and answers from the input."""

    latency_s: float
    name: str = "bench"
    model: str = "bench-fixed-latency"
    prompt_version: str = "bench-v1"
    calls: list[tuple[float, float]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def consolidate(self, request: ConsolidationRequest) -> BackendResponse:
        started = time.perf_counter()
        time.sleep(self.latency_s)
        notes = [o.event.content for o in request.observations]
        output = ConsolidationOutput(
            updated_working_memory=" ".join(notes)[:2_000],
            updated_scaffold={"Notes": notes[-5:]},
            facts=[
                FactProposal(content=o.event.content, type=FactType.LORE, evidence=[o.label])
                for o in request.observations[:2]
            ],
        )
        raw = output.model_dump_json()
        prompt_tokens = sum(len(n.split()) for n in notes) + 800  # about what a prompt carries
        usage = TokenUsage(prompt_tokens=prompt_tokens, completion_tokens=len(raw.split()))
        with self._lock:
            self.calls.append((started, time.perf_counter()))
        return BackendResponse(output, raw, usage, self.model)


def peak_overlap(calls: Sequence[tuple[float, float]]) -> int:
    """The most of these (start, end) calls in flight at once."""
    edges = sorted([(s, 1) for s, _ in calls] + [(e, -1) for _, e in calls])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


@dataclass(frozen=True)
class Row:
    concurrency: int
    users: int
    events: int
    wall_s: float
    flush_mean_ms: float
    llm_mean_ms: float
    peak_overlap: int
    latency_s: float
    index_writes: int
    index_mean_ms: float
    cpu_s: float

    @property
    def users_per_s(self) -> float:
        return self.users / self.wall_s

    @property
    def ideal_users_per_s(self) -> float:
        return self.concurrency / self.latency_s

    @property
    def overhead_batch_ms(self) -> float:
        return self.flush_mean_ms - self.llm_mean_ms

    @property
    def overhead_event_ms(self) -> float:
        return self.overhead_batch_ms / (self.events / self.users)

    @property
    def cpu_event_ms(self) -> float:
        return 1000 * self.cpu_s / self.events


def make_events(users: Sequence[str], per_user: int, week: int = 0) -> list[ContextEvent]:
    at = utc_now()
    events = []
    for u, user in enumerate(users):
        for n in range(per_user):
            subject = SUBJECTS[(u + n + 3 * week) % len(SUBJECTS)]
            events.append(
                ContextEvent(
                    event_id=new_event_id(),
                    user_id=user,
                    organization_id="bench",
                    event_type=EventType.PROJECT_DETAILS if n % 2 else EventType.FACT,
                    content=f"{user} is working on {subject}, step {n + 1} of {per_user}"
                    + (f", week {week + 1}." if week else "."),
                    source_metadata=SourceMetadata(source=Source.INTERACTIVE),
                    occurred_at=at,
                )
            )
    return events


def settings_for(
    base: Settings,
    ends: services.Endpoints,
    run: str,
    dsn: str,
    collection: str,
    concurrency: int,
    batch: int,
) -> Settings:
    return base.model_copy(
        update={
            "kafka": KafkaSettings(
                bootstrap_servers=ends.kafka_bootstrap,
                topic=f"bench-processor-{run}",
                dead_letter_topic=f"bench-processor-{run}.dlq",
                partitions=PARTITIONS,
                log_writer_group=f"bench-log-{run}",
                processor_group=f"bench-processor-{run}",
            ),
            # A flush holds one connection for the user's lock and uses a second meanwhile.
            "postgres": PostgresSettings(dsn=dsn, pool_max_size=max(12, 2 * concurrency + 4)),
            "chroma": ChromaSettings(mode="http", url=ends.chroma_url, collection=collection),
            "processor": ProcessorSettings(
                max_batch=batch, max_wait_s=0.2, concurrency=concurrency, backoff_base_s=0.1
            ),
            "metrics": MetricsSettings(enabled=False),
        }
    )


@contextmanager
def timed_index_writes(durations: list[float]) -> Iterator[None]:
    """Time every `FactIndexer.index_ids` call (one coalesced index write) while inside."""
    original = FactIndexer.index_ids

    def timed(self: FactIndexer, fact_ids: Sequence[uuid.UUID]) -> int:
        started = time.perf_counter()
        try:
            return original(self, fact_ids)
        finally:
            durations.append(time.perf_counter() - started)

    FactIndexer.index_ids = timed  # type: ignore[method-assign]
    try:
        yield
    finally:
        FactIndexer.index_ids = original  # type: ignore[method-assign]


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.02)


def done(dsn: str, events: int) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM consolidated_events),"
            " (SELECT count(*) FROM memory_facts WHERE indexed_at IS NULL),"
            " (SELECT count(*) FROM memory_facts)"
        ).fetchone()
    assert row is not None
    consolidated, pending, facts = row
    return bool(consolidated == events and pending == 0 and facts > 0)


def run_once(
    args: argparse.Namespace, ends: services.Endpoints, base: Settings, concurrency: int
) -> Row:
    run = services.run_id()
    users = [f"bench-user-{run}-{i}" for i in range(args.users)]
    history = [e for w in range(1, args.history + 1) for e in make_events(users, args.events, w)]
    events = make_events(users, args.events)
    backend = FixedLatencyBackend(args.latency_ms / 1000)
    index_writes: list[float] = []
    topics = [f"bench-processor-{run}", f"bench-processor-{run}.dlq"]
    stores = services.scratch_stores(ends, "processor", run, topics, keep=args.keep)
    with stores as (dsn, collection):
        settings = settings_for(base, ends, run, dsn, collection, concurrency, args.events)
        ensure_topics(settings)
        with wiring.core(settings) as c, timed_index_writes(index_writes):
            processor = wiring.processor(c, backend)
            stop = threading.Event()
            thread = threading.Thread(target=processor.run, args=(stop,), daemon=True)
            thread.start()
            try:
                wait_for(lambda: len(processor.assignment()) == PARTITIONS, 120, "partitions")
                publisher = wiring.publisher(settings)
                try:
                    if history:
                        publisher.publish(history)
                        wait_for(lambda: done(dsn, len(history)), 900, "the history consolidated")
                    before = flush_totals(c, backend), len(backend.calls), len(index_writes)
                    cpu = ProcessorCpu()
                    started = time.perf_counter()
                    publisher.publish(events)
                finally:
                    publisher.close()
                total = len(history) + len(events)
                wait_for(lambda: done(dsn, total), 600, "every event consolidated")
                wall = time.perf_counter() - started
                cpu_s = cpu.spent()
            finally:
                stop.set()
                thread.join(timeout=120)
            (flush_sum, flushes), calls, writes = flush_totals(c, backend), *before[1:]
    measured = backend.calls[calls:]
    return Row(
        concurrency=concurrency,
        users=args.users,
        events=len(events),
        wall_s=wall,
        flush_mean_ms=1000 * (flush_sum - before[0][0]) / max(flushes - before[0][1], 1.0),
        llm_mean_ms=1000 * statistics.fmean(e - s for s, e in measured),
        peak_overlap=peak_overlap(measured),
        latency_s=backend.latency_s,
        index_writes=len(index_writes) - writes,
        index_mean_ms=1000 * statistics.fmean(index_writes[writes:] or [0.0]),
        cpu_s=cpu_s,
    )


class ProcessorCpu:
    """CPU time of this process since it was made, less the calling thread's: threads that
    ended meanwhile count too (the process's clock keeps them, a thread's own clock goes with
    it), and the caller (the bench's publishing and polling) does not."""

    def __init__(self) -> None:
        self._process, self._caller = time.process_time(), time.thread_time()

    def spent(self) -> float:
        return (time.process_time() - self._process) - (time.thread_time() - self._caller)


def flush_totals(c: wiring.Core, backend: FixedLatencyBackend) -> tuple[float, float]:
    """The processor's flush time so far, in seconds, and its number of flushes."""
    labels = {"backend": backend.name}
    flush_sum = c.registry.get_sample_value("memoryd_flush_seconds_sum", labels) or 0.0
    return flush_sum, c.registry.get_sample_value("memoryd_flush_seconds_count", labels) or 0.0


def report(rows: Sequence[Row], args: argparse.Namespace) -> str:
    after = f", after {args.history} batches of history" if args.history else ""
    title = (
        f"Processor, fake LLM at {args.latency_ms} ms per call, {args.users} users x"
        f" {args.events} events (one measured batch per user{after}),"
        " real Kafka + Postgres + Chroma"
    )
    lines = [title, "", HEADER, "|---:" * 12 + "|"]
    lines += [
        f"| {r.concurrency} | {r.users_per_s:.2f} | {r.ideal_users_per_s:.2f} | {r.wall_s:.2f} "
        f"| {r.peak_overlap} | {r.flush_mean_ms:.0f} | {r.llm_mean_ms:.0f} "
        f"| {r.overhead_batch_ms:.0f} | {r.overhead_event_ms:.1f} | {r.index_writes} "
        f"| {r.index_mean_ms:.0f} | {r.cpu_event_ms:.1f} |"
        for r in rows
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=32)
    parser.add_argument("--events", type=int, default=5, help="events per user (= batch size)")
    parser.add_argument("--latency-ms", type=int, default=500, help="fake LLM latency per call")
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated")
    parser.add_argument(
        "--history", type=int, default=0, help="unmeasured batches per user before the measured"
    )
    services.add_options(parser, kafka=True)
    args = parser.parse_args(argv)
    base = Settings()
    rows = []
    with services.endpoints(args, base, kafka=True) as ends:
        for concurrency in (int(x) for x in args.concurrency.split(",")):
            rows.append(run_once(args, ends, base, concurrency))
            print(f"concurrency {concurrency}: {rows[-1].users_per_s:.2f} users/s", flush=True)
    print(report(rows, args))


if __name__ == "__main__":
    main()
