"""`memoryd` command line: one entry point for every process and operator task."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import tomllib
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path

from kafka.errors import KafkaError
from pydantic import ValidationError
from pydantic_settings import SettingsError

from memoryd import wiring
from memoryd.analyst.commands import add_commands as add_analyst_commands
from memoryd.analyst.commands import add_memory_arguments, memory_key
from memoryd.dev import ServiceError
from memoryd.erasure_commands import add_commands as add_erasure_commands
from memoryd.ops import commands as ops_commands
from memoryd.ops.logs import configure_logging
from memoryd.ops.topics import TopicConfigError, ensure_topics
from memoryd.redrive import RedriveError
from memoryd.settings import Settings, load_settings
from producers.errors import PublishError
from store.errors import StoreError

log = logging.getLogger("memoryd")
# Commands a person watches: text logs unless log_format is set explicitly.
TERMINAL_COMMANDS = frozenset({"demo", "dev"})


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handle(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping after the current batch", signum)
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    return stop


def cmd_migrate(settings: Settings, _args: argparse.Namespace) -> int:
    from store.migrate import migrate  # noqa: PLC0415
    from store.postgres import make_pool  # noqa: PLC0415

    pool = make_pool(settings.postgres.dsn, max_size=2)
    try:
        applied = migrate(pool)
    finally:
        pool.close()
    print(f"applied {len(applied)} migration(s): {[m.name for m in applied]}")
    return 0


def cmd_topics(settings: Settings, _args: argparse.Namespace) -> int:
    for note in ensure_topics(settings):
        print(note)
    print(f"topics ready: {settings.kafka.topic}, {settings.kafka.dead_letter_topic}")
    return 0


def cmd_log_writer(settings: Settings, args: argparse.Namespace) -> int:
    from memoryd.ops.runtime import run_log_writer  # noqa: PLC0415

    with wiring.core(settings) as c:
        if args.until_idle:
            print(f"logged {wiring.log_writer(c).drain()} record(s)")
            return 0
        run_log_writer(c, _stop_on_signals())
    return 0


def cmd_processor(settings: Settings, args: argparse.Namespace) -> int:
    from memoryd.ops.runtime import run_processor  # noqa: PLC0415

    with wiring.core(settings) as c:
        if args.until_idle:
            wiring.processor(c).run_until_idle()
            return 0
        run_processor(c, _stop_on_signals())
    return 0


# sysexits' EX_UNAVAILABLE: told apart from a check's 1 ("it differs") and a usage error's 2.
EXIT_UNAVAILABLE = 69
# Also a service away or refusing: a topic's settings refused (ACLs), no partition of the
# dead-letter topic assigned in time, a local service that would not start.
UNAVAILABLE = (TopicConfigError, RedriveError, ServiceError)
# Bad lines of a file `memoryd produce` names one by one before it says how many there were.
MAX_LINES_SHOWN = 20


def cmd_produce(settings: Settings, args: argparse.Namespace) -> int:
    """Publish every event of a JSONL file, or none: a bad line is named with its number."""
    from memoryd.sample_stream import read_events  # noqa: PLC0415

    try:
        events, problems = read_events(Path(args.file))
    except OSError as e:
        print(f"memoryd produce: cannot read {args.file}: {e.strerror or e}", file=sys.stderr)
        return 2
    if problems:
        for problem in problems[:MAX_LINES_SHOWN]:
            print(problem, file=sys.stderr)
        print(
            f"memoryd produce: {len(problems)} line(s) are not events"
            f" ({len(events)} are); nothing published",
            file=sys.stderr,
        )
        return 2
    with closing(wiring.publisher(settings)) as pub:
        pub.publish(events)
    print(f"published {len(events)} event(s) to {settings.kafka.topic}")
    return 0


def cmd_context(settings: Settings, args: argparse.Namespace) -> int:
    from store.read.ranking import Budget  # noqa: PLC0415

    key = memory_key(args)
    with wiring.core(settings) as c, wiring.read_path(c) as service:
        bundle = service.assemble(key, args.query, args.connection or [], Budget(args.budget))
    print(bundle.prompt_block)
    return 0


def cmd_dev(settings: Settings, args: argparse.Namespace) -> int:
    from memoryd.dev.stack import DevPorts, DevStack  # noqa: PLC0415

    d = settings.dev
    stack = DevStack(
        d.state_dir, DevPorts(d.kafka_port, d.kafka_controller_port, d.postgres_port, d.chroma_port)
    )
    if args.action == "down":
        stack.down()
        print("local services stopped")
        return 0
    if args.action == "fetch":
        print(f"kafka jars in {stack.kafka.ensure_jars()}")
        return 0
    endpoints = stack.up()
    print(f"kafka     {endpoints.kafka_bootstrap}")
    print(f"postgres  {endpoints.postgres_dsn}")
    print(f"chroma    {endpoints.chroma_url}")
    return 0


def cmd_demo(settings: Settings, args: argparse.Namespace) -> int:
    from memoryd.demo import run_demo  # noqa: PLC0415

    return run_demo(settings, keep_services=args.keep_services)


def cmd_redrive(settings: Settings, args: argparse.Namespace) -> int:
    from memoryd.redrive import redrive  # noqa: PLC0415

    summary = redrive(settings, stages=args.stage, idle_s=args.idle_s)
    print(
        f"redrove {summary.redriven} record(s) to {settings.kafka.topic};"
        f" {summary.settled_by_erasure} settled by an erasure"
    )
    return 0


def cmd_index_pending(settings: Settings, _args: argparse.Namespace) -> int:
    with wiring.core(settings) as c:
        print(f"indexed {wiring.indexer(c).drain_pending()} fact(s)")
    return 0


def cmd_index_verify(settings: Settings, args: argparse.Namespace) -> int:
    with wiring.core(settings) as c:
        result = wiring.index_checker(c).check(repair=not args.dry_run)
    print(
        f"{result.indexed} fact(s) marked indexed: {result.absent} absent from the index,"
        f" {result.differing} held with another text or metadata, {result.repaired} written again"
    )
    print(
        f"{result.held} id(s) in the index: {result.orphans} of facts no row holds,"
        f" {result.removed} deleted; {result.foreign} not fact ids, left alone"
    )
    # A dry run that finds something fails, so a scheduled check can alert on it.
    return 1 if args.dry_run and not result.consistent else 0


def cmd_api(settings: Settings, args: argparse.Namespace) -> int:
    if args.openapi:
        from memoryd.api.openapi import write_openapi  # noqa: PLC0415

        write_openapi(Path(args.openapi))
        print(f"wrote {args.openapi}")
        return 0
    if args.hash_token:
        from memoryd.api.auth import hash_token  # noqa: PLC0415

        # From stdin, so the token stays out of shell history and the process list.
        print(hash_token(sys.stdin.readline().strip()))
        return 0
    from memoryd.api.serve import serve  # noqa: PLC0415 - the API process only

    return serve(settings)


def add_index_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub.add_parser("index-pending", help="index facts Chroma has not got yet").set_defaults(
        fn=cmd_index_pending
    )
    p = sub.add_parser(
        "index-verify",
        help="check Chroma against the facts Postgres marks indexed; write lost vectors again"
        " and delete those of facts no row holds",
    )
    p.add_argument("--dry-run", action="store_true", help="only count; exit 1 if not consistent")
    p.set_defaults(fn=cmd_index_verify)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memoryd", description=__doc__)
    parser.add_argument("--config", type=Path, help="TOML settings file (env vars override it)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("migrate", help="apply the Postgres migrations").set_defaults(fn=cmd_migrate)
    sub.add_parser("topics", help="create the Kafka topics").set_defaults(fn=cmd_topics)
    p = sub.add_parser("log-writer", help="run the event-log writer consumer")
    p.add_argument("--until-idle", action="store_true")
    p.set_defaults(fn=cmd_log_writer)
    p = sub.add_parser("processor", help="run the MemoryProcessor consumer")
    p.add_argument("--until-idle", action="store_true")
    p.set_defaults(fn=cmd_processor)
    p = sub.add_parser("produce", help="publish events from a JSONL file")
    p.add_argument("file")
    p.set_defaults(fn=cmd_produce)
    p = sub.add_parser("context", help="print the context a chat turn would get")
    add_memory_arguments(p)
    p.add_argument("--query", required=True)
    p.add_argument("--connection", action="append")
    p.add_argument("--budget", choices=["lean", "balanced", "deep"], default="balanced")
    p.set_defaults(fn=cmd_context)
    p = sub.add_parser("dev", help="start or stop local Kafka, Postgres and Chroma")
    p.add_argument(
        "action",
        choices=["up", "down", "fetch"],
        help="fetch: only download what `up` needs (the Kafka jars, once), start nothing",
    )
    p.set_defaults(fn=cmd_dev)
    p = sub.add_parser("demo", help="the whole pipeline end to end over the bundled sample stream")
    p.add_argument("--keep-services", action="store_true")
    p.set_defaults(fn=cmd_demo)
    p = sub.add_parser("redrive", help="put dead-lettered events back on the event topic")
    p.add_argument(
        "--stage",
        action="append",
        default=None,
        choices=("consolidate", "budget"),
        help="only these stages; default both (each stage keeps its own progress)",
    )
    p.add_argument("--idle-s", type=float, default=3.0)
    p.set_defaults(fn=cmd_redrive)
    add_index_commands(sub)
    add_erasure_commands(sub)
    p = sub.add_parser("api", help="serve the HTTP API (and its metrics) with uvicorn")
    p.add_argument("--openapi", metavar="PATH", help="write the OpenAPI document and exit")
    p.add_argument(
        "--hash-token", action="store_true", help="read a token on stdin, print its digest"
    )
    p.set_defaults(fn=cmd_api)
    add_analyst_commands(sub)  # history, replay, export
    ops_commands.add_commands(sub)  # explain, replay verify, maintenance
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(
        ops_commands.rewrite_argv(list(sys.argv[1:] if argv is None else argv))
    )
    try:
        settings = load_settings(args.config)
    except (OSError, tomllib.TOMLDecodeError, ValidationError, SettingsError) as e:
        print(f"memoryd: the settings cannot be used: {e}", file=sys.stderr)
        return 2
    fmt = settings.log_format
    if args.command in TERMINAL_COMMANDS and "log_format" not in settings.model_fields_set:
        fmt = "text"  # someone is reading the terminal, not a log pipeline
    configure_logging(settings.log_level, fmt)
    try:
        code: int = args.fn(settings, args)
    except (StoreError, KafkaError, PublishError, *UNAVAILABLE) as e:
        # A service away or refusing (Postgres, Chroma, the broker, the model file, the
        # schema's version) is the operator's to fix, not a bug: one line says which. The
        # trace is logged for those who run with MEMORYD_LOG_LEVEL=DEBUG.
        log.debug("memoryd %s failed", args.command, exc_info=True)
        print(f"memoryd {args.command}: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return code


if __name__ == "__main__":
    sys.exit(main())
