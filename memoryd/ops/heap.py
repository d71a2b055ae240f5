"""The cyclic garbage collector of a long-running serving process.

CPython's defaults (a young collection every 700 net allocations, a full one whenever the
objects promoted since the last reach a quarter of the old generation) suit short scripts. An
API worker keeps a large old generation for good: its imports and wiring (about 150,000
container objects) and the memories' entries (some 13 per cached fact). Turns in flight
outlive the frequent young collections and are promoted, so full collections follow every few
seconds, and each walks the whole old generation with the GIL held. Measured on 2 cores, 16
concurrent turns, 10,000 facts cached per worker: a full collection every 4-8 s taking
260-455 ms, every turn in flight stalled by as much.

The log writer is the same case in another shape: each poll decodes thousands of events that
live until their batch is logged, so they are promoted and full collections walk the
start-up heap over and over. Freezing it took the writer from 40 to 26 us of CPU per event
(BENCHMARKS, Ingest); its thresholds made no further difference.
"""

from __future__ import annotations

import gc


def settle(thresholds: tuple[int, int, int] | None = None) -> None:
    """Freeze what survives start-up out of every later collection; collect less often if told.

    Called once the process is wired, before it serves: what it holds then lives as long as
    the process and is never garbage. Later objects are collected as before, cycles included.
    `None` keeps the interpreter's thresholds.
    """
    gc.collect()
    gc.freeze()
    if thresholds is not None:
        gc.set_threshold(*thresholds)
