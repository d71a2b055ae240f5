"""bench.processor's CPU clock: the processor's threads count, the bench's own thread does not."""

from __future__ import annotations

import threading
import time

from bench.processor import ProcessorCpu

BURN_S = 0.1


def _burn(seconds: float) -> None:
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


def test_a_thread_that_ended_is_counted() -> None:
    cpu = ProcessorCpu()
    worker = threading.Thread(target=_burn, args=(BURN_S,))
    worker.start()
    worker.join()
    assert cpu.spent() >= BURN_S


def test_the_calling_threads_own_cpu_is_left_out() -> None:
    cpu = ProcessorCpu()
    _burn(BURN_S)
    assert cpu.spent() < BURN_S / 2
