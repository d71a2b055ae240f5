"""Prompt tokens per event against the size of a user's memory, through the real pipeline.

    python -m bench.prompt_cost [--sizes 10,1000,10000] [--users 3] [--batches 3]
        [--batch 20] [--kafka HOST:PORT] [--dsn DSN] [--chroma-url URL] [--keep]

For each size, `--users` users get that many facts (bench.synthetic_memory: facts
from 15 templates, 20 % in a connection's scope, 5 % archived or contradicted, 1 % pinned),
loaded with `PostgresMemoryStore.insert_facts` and indexed by the index drain, plus a W of
about 300 words and a scaffold of about 18 items. Each user then publishes `--batches`
batches of `--batch` observations drawn from the same templates, and the real processor
consolidates them with the Gemini backend (the real google-genai SDK) against the fake Gemini
server of the tests, which counts the prompt it receives (`tests.support.fake_gemini.count_tokens`,
words and punctuation marks: an approximation of a subword tokenizer) and answers with the W
and S it was shown and no fact changes, so memory keeps its size while it is measured.

Reported per size: the facts shown per batch, prompt tokens per batch and per event (from
`consolidation_runs.prompt_tokens`, what the fake reported), and, for the same requests,
what the previous selection (pinned, then most salient, then most recent, up to 200 facts)
would have put in the prompt, counted the same way.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import random
import re
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import psycopg

from bench import services
from bench.processor import settings_for, wait_for
from bench.synthetic_memory import ORGANIZATION, TEMPLATES, TextPool, fill, load_users, make_facts
from domain.ids import MemoryKey
from domain.model import Fact, FactStatus
from memoryd import wiring
from memoryd.ops.topics import ensure_topics
from memoryd.settings import Settings
from processors.llm.gemini import GeminiBackend, make_gemini_client
from processors.prompt import build_prompt
from processors.schema import ConsolidationRequest
from producers.contract import ContextEvent, EventType, Source, SourceMetadata, new_event_id
from tests.support.fake_gemini import FakeGemini, FakeReply, RecordedRequest, count_tokens

PARTITIONS = 6
OLD_PROMPT_FACTS = 200
_W = re.compile(r"<working_memory>(.*?)</working_memory>", re.DOTALL)
_S = re.compile(r"<scaffold>(.*?)</scaffold>", re.DOTALL)


def echo_model(request: RecordedRequest) -> FakeReply:
    """Answers with the W and S it was shown and no fact changes; counts the prompt."""
    w, s = _W.search(request.user_text), _S.search(request.user_text)
    answer = {
        "updated_working_memory": html.unescape(w.group(1)) if w else "",
        "updated_scaffold": json.loads(html.unescape(s.group(1))) if s else {},
        "facts": [],
    }
    text = json.dumps(answer)
    return FakeReply.text(text, prompt_tokens=None, completion_tokens=count_tokens(text))


def observations(user: str, batches: int, size: int, seed: int) -> list[ContextEvent]:
    rng = random.Random(f"{seed}:events:{user}")
    return [
        ContextEvent(
            event_id=new_event_id(),
            user_id=user,
            organization_id=ORGANIZATION,
            event_type=EventType.FACT,
            content=fill(rng.choice(TEMPLATES), rng),
            source_metadata=SourceMetadata(source=Source.INTERACTIVE),
            occurred_at=datetime.now(UTC),
        )
        for _ in range(batches * size)
    ]


@dataclass(frozen=True)
class Row:
    facts: int
    batches: int
    events: int
    shown: float  # facts shown per batch, mean
    prompt_per_batch: float
    prompt_per_event: float
    old_per_batch: float  # the previous selection, same prompt otherwise

    @property
    def old_per_event(self) -> float:
        return self.old_per_batch * self.batches / self.events


def old_selection(facts: Sequence[Fact]) -> tuple[Fact, ...]:
    """What prompt v2 showed: pinned, then most salient, then most recent, up to 200."""
    ranked = sorted(
        facts, key=lambda f: (not f.pinned, -f.salience, -f.updated_at.timestamp(), str(f.fact_id))
    )
    return tuple(ranked[:OLD_PROMPT_FACTS])


def old_prompt_tokens(c: wiring.Core, user: str, events: Sequence[ContextEvent]) -> int:
    key = MemoryKey(ORGANIZATION, user)
    state = c.memory.load_state(key)
    facts = c.memory.facts(key, (FactStatus.ACTIVE, FactStatus.HELD))
    request = ConsolidationRequest.build(
        state, old_selection(facts), list(events), datetime.now(UTC), known_facts=len(facts)
    )
    prompt = build_prompt(request)
    return count_tokens(prompt.system_instruction) + count_tokens(prompt.user_content)


def load(c: wiring.Core, sizes: Sequence[int], users: int, seed: int) -> dict[int, list[str]]:
    pool = TextPool.embedded(max(sizes), c.embedder, seed)
    by_size = {n: [f"bench-{n}-facts-{i}" for i in range(users)] for n in sizes}
    everyone = [u for us in by_size.values() for u in us]
    load_users(c, everyone, seed)
    started = time.perf_counter()
    for n, members in by_size.items():
        for user in members:
            facts, _ = make_facts(pool, user, range(n), seed)
            c.memory.insert_facts(facts)
    indexed = wiring.indexer(c).drain_pending(batch=2_000)
    print(
        f"loaded and indexed {indexed} facts in {time.perf_counter() - started:.0f} s", flush=True
    )
    return by_size


def consolidate(c: wiring.Core, fake: FakeGemini, events: Sequence[ContextEvent], dsn: str) -> None:
    with make_gemini_client("bench-key", fake.url, 60_000) as client:
        processor = wiring.processor(c, GeminiBackend(client))
        stop = threading.Event()
        thread = threading.Thread(target=processor.run, args=(stop,), daemon=True)
        thread.start()
        try:
            wait_for(lambda: len(processor.assignment()) == PARTITIONS, 120, "partitions")
            publisher = wiring.publisher(c.settings)
            try:
                publisher.publish(events)
            finally:
                publisher.close()
            wait_for(lambda: consolidated(dsn) == len(events), 1_200, "every batch consolidated")
        finally:
            stop.set()
            thread.join(timeout=120)


def consolidated(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM consolidated_events").fetchone()
    return int(row[0]) if row else 0


def measured(dsn: str, users: Sequence[str]) -> list[tuple[int, int, int]]:
    """(events, prompt tokens, facts shown) of every succeeded run of these users."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT cardinality(input_event_ids), prompt_tokens,"
            " jsonb_array_length(output->'candidates'->'shown') FROM consolidation_runs"
            " WHERE organization_id = %s AND user_id = ANY(%s) AND status = 'succeeded'",
            (ORGANIZATION, list(users)),
        ).fetchall()
    return [(int(a), int(b), int(c)) for a, b, c in rows]


def run(args: argparse.Namespace, ends: services.Endpoints, base: Settings) -> list[Row]:
    sizes = [int(x) for x in args.sizes.split(",")]
    run_id = services.run_id()
    topics = [f"bench-processor-{run_id}", f"bench-processor-{run_id}.dlq"]
    with (
        services.scratch_stores(ends, "prompt", run_id, topics, keep=args.keep) as (
            dsn,
            collection,
        ),
        FakeGemini(responder=echo_model) as fake,
    ):
        settings = settings_for(base, ends, run_id, dsn, collection, 4, args.batch)
        # Batches are cut at --batch events, never by age: every run is a full batch.
        tuning = settings.processor.model_copy(update={"max_wait_s": 5.0})
        settings = settings.model_copy(update={"processor": tuning})
        ensure_topics(settings)
        with wiring.core(settings) as c:
            by_size = load(c, sizes, args.users, args.seed)
            events = {
                u: observations(u, args.batches, args.batch, args.seed)
                for us in by_size.values()
                for u in us
            }
            consolidate(c, fake, [e for es in events.values() for e in es], dsn)
            rows = []
            for n, users in by_size.items():
                runs = measured(dsn, users)
                old = [
                    old_prompt_tokens(c, u, events[u][i : i + args.batch])
                    for u in users
                    for i in range(0, len(events[u]), args.batch)
                ]
                rows.append(row(n, runs, old))
            # Printed before the scratch space is removed: dropping a large collection can
            # time out on a busy machine, and the figures must not go down with it.
            print(report(rows, args), flush=True)
    return rows


def row(size: int, runs: Sequence[tuple[int, int, int]], old: Sequence[int]) -> Row:
    events = sum(r[0] for r in runs)
    prompt = sum(r[1] for r in runs)
    return Row(
        facts=size,
        batches=len(runs),
        events=events,
        shown=statistics.fmean(r[2] for r in runs),
        prompt_per_batch=prompt / len(runs),
        prompt_per_event=prompt / events,
        old_per_batch=statistics.fmean(old),
    )


def report(rows: Sequence[Row], args: argparse.Namespace) -> str:
    base = rows[0].prompt_per_event
    intro = (
        f"{args.users} user(s) per size, {args.batches} batch(es) of {args.batch} observations"
        " each; prompt tokens as the fake Gemini counted them."
    )
    header = (
        "| facts per user | batches | facts shown / batch | prompt tokens / batch"
        f" | prompt tokens / event | vs {rows[0].facts} facts | previous selection: tokens /"
        " batch | previous: tokens / event |"
    )
    lines = [
        intro,
        "",
        header,
        "|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    lines += [
        f"| {r.facts:,} | {r.batches} | {r.shown:.1f} | {r.prompt_per_batch:,.0f}"
        f" | {r.prompt_per_event:,.1f} | {100 * (r.prompt_per_event / base - 1):+.1f} %"
        f" | {r.old_per_batch:,.0f} | {r.old_per_event:,.1f} |"
        for r in rows
    ]
    load1, load5, load15 = os.getloadavg()
    lines += ["", f"Load average at the end {load1:.1f}/{load5:.1f}/{load15:.1f} (1/5/15 min)."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,1000,10000", help="facts per user, comma-separated")
    parser.add_argument("--users", type=int, default=3, help="users per size")
    parser.add_argument("--batches", type=int, default=3, help="batches per user")
    parser.add_argument("--batch", type=int, default=20, help="observations per batch")
    parser.add_argument("--seed", type=int, default=11)
    services.add_options(parser, kafka=True)
    args = parser.parse_args(argv)
    base = Settings()
    started = time.perf_counter()
    with services.endpoints(args, base, kafka=True) as ends:
        run(args, ends, base)
    print(f"Whole bench: {time.perf_counter() - started:.0f} s.")


if __name__ == "__main__":
    main()
