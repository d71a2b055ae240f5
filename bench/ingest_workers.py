"""The processes `bench.ingest` runs: producers publishing a slice of the events, and log
writers (one `LogWriter` each, as `memoryd log-writer` runs it) in one consumer group.

Each reports its own CPU time back, so the figures say what an event costs on each side as
well as how fast it went on a machine shared with other work.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from typing import Any

from memoryd import wiring
from memoryd.ops import heap
from memoryd.settings import Settings

PUBLISH_BATCH = 1_000
# spawn, not fork: the parent holds Kafka and Postgres clients with threads of their own.
_MP = mp.get_context("spawn")


@dataclass(frozen=True)
class Published:
    events: int
    started: float  # time.monotonic(), comparable across processes on one machine
    finished: float
    cpu_s: float


def _publish(
    settings: Settings,
    make: Callable[[int, int], Sequence[Any]],
    first: int,
    count: int,
    go: Event,
    out: Any,
) -> None:
    events = make(first, count)
    # The bench's inputs, made before the clock starts, are frozen out of the collector: a
    # service publishes events as they come and holds no 50,000 of them in its heap.
    gc.freeze()
    publisher = wiring.publisher(settings)
    try:
        go.wait()
        cpu, started = time.process_time(), time.monotonic()
        for i in range(0, len(events), PUBLISH_BATCH):
            publisher.publish(events[i : i + PUBLISH_BATCH])
        out.put(Published(len(events), started, time.monotonic(), time.process_time() - cpu))
    finally:
        publisher.close()


def publish(
    settings: Settings, make: Callable[[int, int], Sequence[Any]], total: int, producers: int
) -> list[Published]:
    """`total` events, `make(first, count)` of them per process, published by `producers`
    processes that start together once all have built their events."""
    go, out = _MP.Event(), _MP.Queue()
    share = -(-total // producers)
    procs = [
        _MP.Process(
            target=_publish,
            args=(settings, make, first, min(share, total - first), go, out),
            name=f"bench-producer-{n}",
        )
        for n, first in enumerate(range(0, total, share))
    ]
    for p in procs:
        p.start()
    go.set()
    results = [out.get(timeout=900) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        if p.exitcode != 0:
            raise SystemExit(f"{p.name} exited with {p.exitcode}")
    return results


def _write(settings: Settings, partitions: Synchronized[int], stop: Event, out: Any) -> None:
    with wiring.core(settings) as c:
        writer = wiring.log_writer(c)
        heap.settle()  # as `memoryd log-writer` does once wired
        halt = threading.Event()
        thread = threading.Thread(target=writer.run, args=(halt,), name="log-writer")
        cpu = time.process_time()
        thread.start()
        while not stop.wait(0.05):
            snap = writer.liveness.snapshot()
            partitions.value = snap.partitions if snap.joined else 0
        halt.set()
        thread.join(timeout=120)
        out.put(time.process_time() - cpu)


@dataclass
class Writers:
    cpu_s: list[float]


@contextmanager
def writers(settings: Settings, count: int, timeout_s: float = 180) -> Iterator[Writers]:
    """`count` log-writer processes, yielded once the group's partitions are all assigned."""
    stop, out = _MP.Event(), _MP.Queue()
    owned = [_MP.Value("i", 0) for _ in range(count)]
    procs = [
        _MP.Process(target=_write, args=(settings, owned[n], stop, out), name=f"bench-writer-{n}")
        for n in range(count)
    ]
    for p in procs:
        p.start()
    result = Writers([])
    try:
        deadline = time.monotonic() + timeout_s
        stable_since = None
        while stable_since is None or time.monotonic() - stable_since < 1.0:
            if time.monotonic() > deadline:
                raise SystemExit(f"the log writers did not share the partitions in {timeout_s} s")
            full = sum(v.value for v in owned) == settings.kafka.partitions
            stable_since = (stable_since or time.monotonic()) if full else None
            time.sleep(0.05)
        yield result
    finally:
        stop.set()
        result.cpu_s.extend(out.get(timeout=180) for _ in procs)
        for p in procs:
            p.join(timeout=60)
