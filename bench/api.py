"""The HTTP API under load: `POST /v1/context` at rising concurrency against `memoryd api`.

    python -m bench.api [--facts 100000] [--facts-per-user 100] [--levels 1,4,16,64]
        [--duration 15] [--workers N] [--json-out FILE] [services options]

Loads synthetic memory (`bench.synthetic_memory`) into a scratch database and Chroma collection,
starts a real `memoryd api` process over it (its own worker processes, pools and caches, as
configured by `MEMORYD_*` settings; `--workers` overrides `api.workers`), reads each user
once, then drives it at each concurrency for `--duration` seconds: that many client threads,
each with one keep-alive connection, sending a random user's chat message (a lead-in and a
templated question, no two alike in a run) with one of their connections active, the next
request as soon as the last answered. Reports req/s, p50 and p99 per level, non-200 answers
as errors, and the API processes' resident memory.
The client runs on the same machine and takes its share of the cores.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import random
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench import services
from bench import synthetic_memory as synthetic
from bench.locomo.metrics import markdown_table
from bench.read_path import Population, load, sample_requests
from memoryd import wiring
from memoryd.api.auth import hash_token
from memoryd.settings import Settings
from store.embeddings import MiniLmEmbedder

STARTUP_TIMEOUT_S = 120.0
# Distinct request bodies, more than the default levels send at 400 req/s.
REQUESTS = 60_000


@dataclass(frozen=True)
class Level:
    concurrency: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int

    def as_json(self) -> dict[str, object]:
        return {
            "concurrency": self.concurrency,
            "rps": round(self.rps, 1),
            "p50_ms": round(self.p50_ms, 2),
            "p99_ms": round(self.p99_ms, 2),
            "errors": self.errors,
        }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def api_process(env: dict[str, str], port: int) -> Iterator[subprocess.Popen[bytes]]:
    """`memoryd api` in its own process group, answering /healthz; stopped at the end.

    Its stderr goes to a file, not a pipe: a pipe nobody reads during the run fills up and
    blocks the server at its next log line."""
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(
            [sys.executable, "-c", "from memoryd.cli import main; raise SystemExit(main(['api']))"],
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while not _healthy(port):
                if process.poll() is not None or time.monotonic() > deadline:
                    if process.poll() is None:
                        process.terminate()
                        process.wait(timeout=30)
                    stderr.seek(0)
                    err = stderr.read().decode(errors="replace")
                    raise SystemExit(f"memoryd api did not start:\n{err[-4000:]}")
                time.sleep(0.2)
            yield process
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _healthy(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/healthz")
        ok = conn.getresponse().status == 200
        conn.close()
    except OSError:
        return False
    return ok


def tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and its children (the API's workers), in MB."""
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(p) for p in children.read_text().split()]
    total_kb = 0
    for p in pids:
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total_kb += int(line.split()[1])
    return total_kb / 1024


class Bodies:
    """Request bodies handed out in order across every level, each once while they last: a
    body sent again finds its query's vector in the API's cache."""

    def __init__(self, bodies: Sequence[bytes]) -> None:
        self._bodies = bodies
        self._sent = itertools.count()
        self.taken = 0

    def take(self) -> bytes:
        # itertools.count's next is atomic under the GIL: no two clients get the same index.
        self.taken = next(self._sent)
        return self._bodies[self.taken % len(self._bodies)]

    @property
    def repeated(self) -> int:
        return max(0, self.taken + 1 - len(self._bodies))


def drive(port: int, token: str, bodies: Bodies, concurrency: int, duration_s: float) -> Level:
    """`concurrency` clients sending back to back for `duration_s`."""
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    errors = [0] * concurrency
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    start = threading.Barrier(concurrency + 1)
    deadline = [0.0]

    def client(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        start.wait()
        while time.perf_counter() < deadline[0]:
            body = bodies.take()
            began = time.perf_counter()
            try:
                conn.request("POST", "/v1/context", body=body, headers=headers)
                response = conn.getresponse()
                response.read()
                ok = response.status == 200
            except (OSError, http.client.HTTPException):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                ok = False
            latencies[k].append((time.perf_counter() - began) * 1000)
            errors[k] += not ok
        conn.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    began = time.perf_counter()
    deadline[0] = began + duration_s
    start.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    flat = [ms for per in latencies for ms in per]
    p50, p99 = np.percentile(flat, [50, 99])
    return Level(concurrency, len(flat) / elapsed, float(p50), float(p99), sum(errors))


def warm_up(port: int, token: str, bodies: Sequence[bytes], concurrency: int = 4) -> None:
    """Send every body once, each on its own connection, from `concurrency` clients."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    pending = iter(bodies)
    lock = threading.Lock()

    def client() -> None:
        while True:
            with lock:
                body = next(pending, None)
            if body is None:
                return
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                conn.request("POST", "/v1/context", body=body, headers=headers)
                conn.getresponse().read()
            finally:
                conn.close()

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _every_user(users: Sequence[str], passes: int, seed: int) -> list[bytes]:
    """`passes` requests for each user, a random connection and question each."""
    rng = random.Random(seed)
    bodies = []
    for _ in range(passes):
        for user in users:
            query = synthetic.fill_query(rng)
            bodies.append(_body(user, rng.choice(synthetic.connection_ids(user)), query))
    return bodies


def _bodies(users: Sequence[str], count: int, seed: int) -> list[bytes]:
    return [_body(*request) for request in sample_requests(users, count, seed)]


def _body(user: str, connection: str, query: str) -> bytes:
    return json.dumps(
        {"user_id": user, "query": query, "active_connection_ids": [connection]}
    ).encode()


def run(args: argparse.Namespace) -> tuple[list[Level], str]:
    base = Settings()
    per_user = sorted(int(s) for s in args.facts_per_user.split(","))
    population = Population.at(args.facts, per_user, args.heavy_users)
    embedder = MiniLmEmbedder(model_name=base.embedding_model)
    pool = synthetic.TextPool.embedded(args.distinct_texts, embedder, args.seed)
    token = secrets.token_urlsafe(24)
    levels: list[Level] = []
    with (
        services.endpoints(args, base, kafka=True) as ends,
        services.scratch_memory(base, ends, "api", keep=args.keep) as settings,
    ):
        collection = settings.chroma.collection
        started = time.perf_counter()
        with wiring.core(settings) as c:
            for n, users in population.tiers.items():
                synthetic.load_users(c, users, args.seed)
                load(c, ends, collection, pool, users, range(n), args.seed)
            synthetic.analyze(c)
        load_s = time.perf_counter() - started
        port = _free_port()
        env = {
            "MEMORYD_POSTGRES__DSN": settings.postgres.dsn,
            "MEMORYD_CHROMA__MODE": "http",
            "MEMORYD_CHROMA__URL": ends.chroma_url,
            "MEMORYD_CHROMA__COLLECTION": collection,
            "MEMORYD_KAFKA__BOOTSTRAP_SERVERS": ends.kafka_bootstrap,
            "MEMORYD_API__PORT": str(port),
            "MEMORYD_API__TOKENS": json.dumps({hash_token(token): synthetic.ORGANIZATION}),
            "MEMORYD_METRICS__ENABLED": "false",
            "MEMORYD_LOG_LEVEL": "WARNING",
        }
        if args.workers:
            env["MEMORYD_API__WORKERS"] = str(args.workers)
        users = [u for tier in population.tiers.values() for u in tier]
        bodies = Bodies(_bodies(users, REQUESTS, args.seed))
        with api_process(env, port) as process:
            # Every user read by every worker, as in a warm service: the kernel hands each
            # connection to one worker, so each pass reads every user on fresh connections.
            workers = args.workers or base.api.workers
            warm_up(port, token, _every_user(users, 8 * workers, args.seed + 1))
            drive(port, token, bodies, 4, args.warmup)
            for concurrency in args.levels:
                levels.append(drive(port, token, bodies, concurrency, args.duration))
            rss = tree_rss_mb(process.pid)
    repeats = f"; {bodies.repeated:,} requests repeated" if bodies.repeated else ""
    note = (
        f"{args.facts:,} facts ({args.facts_per_user} per user), loaded in {load_s:.0f} s;"
        f" API workers {args.workers or base.api.workers}; {args.duration:.0f} s per level"
        f" after a {args.warmup:.0f} s warm-up at 4; API resident memory {rss:.0f} MB"
        f"; every request a different chat message{repeats}"
    )
    return levels, note


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", type=int, default=100_000)
    parser.add_argument("--facts-per-user", default="100")
    parser.add_argument("--heavy-users", type=int, default=10, help="users per larger tier")
    parser.add_argument("--distinct-texts", type=int, default=4_000)
    parser.add_argument(
        "--levels", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16, 64]
    )
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per level")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds before measuring")
    parser.add_argument("--workers", type=int, default=0, help="override api.workers")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json-out", type=Path)
    services.add_options(parser, kafka=True)
    args = parser.parse_args(argv)
    levels, note = run(args)
    print(note)
    print()
    print(
        markdown_table(
            ["concurrency", "req/s", "p50", "p99", "errors"],
            [
                [
                    x.concurrency,
                    f"{x.rps:.0f}",
                    f"{x.p50_ms:.1f} ms",
                    f"{x.p99_ms:.1f} ms",
                    x.errors,
                ]
                for x in levels
            ],
        )
    )
    print()
    print(
        "load average at the end "
        f"{'/'.join(f'{x:.1f}' for x in os.getloadavg())} (1/5/15 min) on {os.cpu_count()} CPUs"
    )
    if args.json_out:
        document = {"levels": [level.as_json() for level in levels]}
        args.json_out.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
