"""The analyst commands' arguments and what each one runs (see `memoryd.analyst`)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from consumers.batch_retry import BatchRetry
from consumers.replay import (
    ShadowBatch,
    Step,
    batches_by_size,
    batches_like_live,
    shadow_consolidate,
    unredacted,
)
from consumers.replay_result import ReplayStopped
from domain.ids import MemoryKey
from domain.model import FactStatus, LoggedRun
from memoryd import wiring
from memoryd.analyst.export import STREAMED, export_sections, write_json
from memoryd.analyst.render import (
    erasure_json,
    render_diff,
    render_memory,
    render_runs,
    replay_json,
    run_json,
)
from memoryd.settings import Settings
from processors.diff import diff_memory, split_erased
from processors.fold import FoldedMemory, FoldError, fold_runs, live_image, runs_until
from producers.contract import ID_PATTERN, MAX_ID_CHARS
from store.postgres import snapshot
from store.write.erasure_log import PostgresErasureLog
from store.write.event_log import PostgresEventLog
from store.write.memory_store import PostgresMemoryStore
from store.write.run_log import PostgresRunLog, read_only_dsn

# sysexits' EX_NOPERM: the backend refused the key. Told apart from a replay that left events
# out (1), a usage error (2) and a service away (69): only an operator's fix of the key helps.
EXIT_CREDENTIALS_REFUSED = 77


@contextmanager
def analyst_core(settings: Settings) -> Iterator[tuple[wiring.Core, PostgresRunLog]]:
    postgres = settings.postgres.model_copy(update={"dsn": read_only_dsn(settings.postgres.dsn)})
    with wiring.core(settings.model_copy(update={"postgres": postgres})) as c:
        yield c, PostgresRunLog(c.pool)


@contextmanager
def memory_snapshot(c: wiring.Core) -> Iterator[tuple[wiring.Core, PostgresRunLog]]:
    """`c` with its stores reading one snapshot of the database (`store.postgres.snapshot`),
    and a run log on the same: a memory's runs, facts, events and ledger as of one moment,
    however the pipeline writes meanwhile. One memory a snapshot: it holds back vacuum."""
    with snapshot(c.pool) as snap:
        at = replace(
            c,
            pool=snap,
            memory=PostgresMemoryStore(snap),
            events=PostgresEventLog(snap, c.subjects),
            erasures=PostgresErasureLog(snap),
        )
        yield at, PostgresRunLog(snap)


def live_memory(c: wiring.Core, run_log: PostgresRunLog, key: MemoryKey) -> FoldedMemory:
    return live_image(
        c.memory.load_state(key),
        c.memory.facts(key, tuple(FactStatus)),
        run_log.connections(key),
    )


def memory_key(args: argparse.Namespace) -> MemoryKey:
    return MemoryKey(args.org, args.user)


def identifier(text: str) -> str:
    """An organization or user id as events spell them: no other names a memory, and an empty
    one would reach `MemoryKey` and fail there, after connecting."""
    if len(text) > MAX_ID_CHARS or not re.fullmatch(ID_PATTERN, text):
        raise argparse.ArgumentTypeError(
            f"not an id (1 to {MAX_ID_CHARS} of A-Z a-z 0-9 _ . : @ -): {text!r}"
        )
    return text


def add_memory_arguments(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    """--org ORG USER: a user id names a memory only within its organization. Not `required`:
    the command checks them itself (it has another way to say what it acts on)."""
    p.add_argument(
        "--org", type=identifier, required=required, help="the organization the user belongs to"
    )
    p.add_argument("user", type=identifier, nargs=None if required else "?")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from e
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def parse_time(text: str) -> datetime:
    """ISO 8601; a time without an offset is UTC."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from e
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def cmd_history(settings: Settings, args: argparse.Namespace) -> int:
    key = memory_key(args)
    # Read in pages from one snapshot, and only what is printed: the listing shows no run's
    # output, and neither shows a raw model response (`memoryd export` has them).
    with analyst_core(settings) as (c, _), memory_snapshot(c) as (_, run_log):
        if args.at is None:
            runs = list(run_log.iter_runs(key, output=False))
            if args.json:
                doc = {"organization_id": args.org, "user_id": args.user}
                print(json.dumps({**doc, "runs": [run_json(r) for r in runs]}))
            else:
                print(render_runs(key, runs))
            return 0
        at: datetime = args.at
        before: list[dict[str, Any]] = []

        def listed(runs: Iterable[LoggedRun]) -> Iterator[LoggedRun]:
            for logged in runs:
                before.append(run_json(logged))
                yield logged

        try:
            memory = fold_runs(
                listed(runs_until(run_log.iter_runs(key), at)),
                FoldedMemory(user_id=args.user, organization_id=args.org),
            )
        except FoldError as e:
            print(f"memoryd history: the run log does not fold: {e}", file=sys.stderr)
            return 1
    if args.json:
        doc = {
            "organization_id": args.org,
            "user_id": args.user,
            "at": at.isoformat(),
            "runs": before,
            "memory": memory.to_json(),
        }
        print(json.dumps(doc, ensure_ascii=False, default=str))
    else:
        print(render_memory(memory, at))
    return 0


def _shadow_settings(settings: Settings, args: argparse.Namespace) -> Settings:
    llm = {"backend": args.backend or settings.llm.backend}
    if args.model:
        llm["model"] = args.model
    return settings.model_copy(update={"llm": settings.llm.model_copy(update=llm)})


def cmd_replay(settings: Settings, args: argparse.Namespace) -> int:
    if args.backend == "gemini" and settings.llm.api_key is None:
        print("memoryd replay: --backend gemini needs MEMORYD_LLM__API_KEY", file=sys.stderr)
        return 2
    if args.max_batch is None:
        args.max_batch = settings.processor.max_batch
    key = memory_key(args)
    with analyst_core(_shadow_settings(settings, args)) as (c, _):
        # The log, the runs and live memory as of one moment, read before the shadow's calls:
        # read after them (minutes with a model), runs committed meanwhile were differences.
        with memory_snapshot(c) as (at, run_log):
            logged = [e.event for e in at.events.user_events(key)]
            runs = list(run_log.iter_runs(key)) if args.batching == "live" else []
            live = live_memory(at, run_log, key)
        events, erased = unredacted(logged)
        batches: list[Step] = []
        if args.batching == "live":
            batches = batches_like_live(events, runs, args.max_batch)
        else:
            batches.extend(batches_by_size(events, args.max_batch))
        n_batches = sum(isinstance(b, ShadowBatch) for b in batches)
        backend, consolidator = wiring.consolidation(c)
        if c.settings.llm.backend == "gemini":
            # Before the first call: a replay makes one or more calls a batch, each billed.
            print(
                f"memoryd replay: calls the paid model {backend.model} for {n_batches}"
                f" batch(es) of {len(events)} event(s); the cost is reported at the end",
                file=sys.stderr,
            )
        try:
            shadow = shadow_consolidate(
                key,
                batches,
                backend,
                consolidator,
                embedder=c.embedder,
                policy=c.settings.processor.candidates,
                max_split_calls=c.settings.processor.max_split_calls,
                retry=BatchRetry.of(c.settings.processor),
            )
        except ReplayStopped as e:
            return _stopped(e)
    # What a fact erasure did to live memory no replay makes again: set apart, not the backend's.
    diff, by_erasure = split_erased(diff_memory(live, shadow.memory), live, erased)
    identity = {
        "backend": backend.name,
        "model": backend.model,
        "prompt_version": backend.prompt_version,
    }
    doc = replay_json(args, len(events), n_batches, shadow, live, diff, identity)
    doc["erasure"] = erasure_json(erased, by_erasure)
    text = render_diff(doc, diff, by_erasure)
    print(json.dumps(doc, ensure_ascii=False, default=str) if args.json else text)
    if shadow.failed:
        # The shadow lacks these events, so the diff is not the backend's alone: a script
        # must not take it for a clean comparison.
        left_out = sum(len(f.event_ids) for f in shadow.failed)
        print(
            f"memoryd replay: {len(shadow.failed)} batch(es) failed, {left_out} of"
            f" {len(events)} event(s) left out of the shadow",
            file=sys.stderr,
        )
        return 1
    return 0


def _stopped(e: ReplayStopped) -> int:
    """No diff: the shadow holds only the batches before the refusal, so it would list the
    rest of memory as differences of the backend's."""
    made = e.partial
    print(
        f"memoryd replay: stopped, the backend refused the credentials ({e}): fix"
        f" MEMORYD_LLM__API_KEY (or its project's access) and run the replay again; no diff"
        f" was made; {len(made.calls)} call(s) made, {made.cost_micro_usd} micro-USD spent",
        file=sys.stderr,
    )
    return EXIT_CREDENTIALS_REFUSED


def cmd_export(settings: Settings, args: argparse.Namespace) -> int:
    out = Path(args.out)
    try:
        # Before the export is read, which can take a while for a long history.
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return _cannot_write(out, e)
    # Written as it is read (`memoryd.analyst.export`), so inside the snapshot.
    with analyst_core(settings) as (c, _), memory_snapshot(c) as (at, run_log):
        doc = export_sections(at, run_log, memory_key(args), c.clock())
        try:
            write_json(out, doc)
        except OSError as e:
            return _cannot_write(out, e)
    n = {k: doc[k].count for k in STREAMED}
    print(
        f"exported {args.user}: {n['events']} event(s), {n['runs']} run(s),"
        f" {n['facts']} fact(s), {n['ledger']} ledger entr(ies) to {out}"
    )
    return 0


def _cannot_write(out: Path, error: OSError) -> int:
    print(f"memoryd export: cannot write {out}: {error.strerror or error}", file=sys.stderr)
    return 1


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("history", help="a user's consolidation runs, or memory at a time")
    add_memory_arguments(p)
    p.add_argument(
        "--at", type=parse_time, help="ISO time: fold the runs committed by then (no offset = UTC)"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_history)
    p = sub.add_parser(
        "replay", help="re-consolidate a user's raw events into a shadow image and diff it"
    )
    add_memory_arguments(p)
    p.add_argument("--backend", choices=["offline", "gemini"], help="default: llm.backend")
    p.add_argument("--model", help="default: llm.model (gemini only)")
    p.add_argument("--max-batch", type=positive_int, help="default: processor.max_batch")
    p.add_argument(
        "--batching",
        choices=["max-batch", "live"],
        default="max-batch",
        help="cut the log every --max-batch events, or reuse the live runs' batches",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_replay)
    p = sub.add_parser("export", help="a user's events, runs, facts, memory and ledger as JSON")
    add_memory_arguments(p)
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_export)
