"""The index thread's writes wait for the processor's flushes to leave the cores."""

from __future__ import annotations

import threading
import time

from consumers.foreground import ForegroundWork, Release
from processors.schema import BackendResponse, ConsolidationRequest
from tests.support.builders import buffered, key_of, make_event
from tests.support.fakes import FlakyBackend
from tests.support.inmemory import InMemoryMemoryd

LONG_S = 30.0  # a bound no passing test reaches


def test_nothing_consolidating_waits_the_whole_bound() -> None:
    foreground = ForegroundWork()
    started = time.monotonic()
    assert foreground.wait_for_quiet(0.05) is Release.BOUND
    assert time.monotonic() - started >= 0.05


def test_a_flush_waiting_on_its_backend_is_quiet_at_once() -> None:
    foreground = ForegroundWork()
    with foreground.working(), foreground.waiting():
        assert foreground.wait_for_quiet(LONG_S) is Release.BACKEND_WAIT
    assert foreground.wait_for_quiet(0) is Release.BOUND


def test_one_flush_at_work_keeps_it_from_quiet_while_another_waits() -> None:
    foreground = ForegroundWork()
    with foreground.working(), foreground.waiting(), foreground.working():
        assert foreground.wait_for_quiet(0.02) is Release.BOUND


def test_the_waiter_wakes_when_the_flush_calls_its_backend() -> None:
    foreground = ForegroundWork()
    at_work = threading.Event()
    call_backend = threading.Event()
    done = threading.Event()

    def flush() -> None:
        with foreground.working():
            at_work.set()
            call_backend.wait(LONG_S)
            with foreground.waiting():
                done.wait(LONG_S)

    thread = threading.Thread(target=flush)
    thread.start()
    at_work.wait(LONG_S)
    threading.Timer(0.05, call_backend.set).start()
    assert foreground.wait_for_quiet(LONG_S) is Release.BACKEND_WAIT
    assert call_backend.is_set()
    done.set()
    thread.join(LONG_S)


class IndexedDuringTheCall(FlakyBackend):
    """From its second call on, waits in the call until the first batch's facts are indexed,
    recording whether they were indexed before the call began."""

    def __init__(self, m: InMemoryMemoryd) -> None:
        super().__init__()
        self._m = m
        self.indexed_before_call: list[int] = []
        self.indexed_in_call: list[int] = []

    def consolidate(self, request: ConsolidationRequest) -> BackendResponse:
        if self.requests:
            self.indexed_before_call.append(self._m.index.count(key_of("ada")))
            deadline = time.monotonic() + LONG_S
            while self._m.index.count(key_of("ada")) == 0 and time.monotonic() < deadline:
                time.sleep(0.005)
            self.indexed_in_call.append(self._m.index.count(key_of("ada")))
        return super().consolidate(request)


def test_a_batchs_index_write_runs_during_the_next_flushs_backend_call() -> None:
    m = InMemoryMemoryd()
    backend = IndexedDuringTheCall(m)
    flusher = m.flusher(backend, index_yield_s=LONG_S)
    flusher.flush(key_of("ada"), buffered([make_event("ada", "I live in Lisbon")]), attempt=0)
    flusher.flush(key_of("ada"), buffered([make_event("ada", "I like green tea")]), attempt=0)
    flusher.close()

    assert backend.indexed_before_call == [0]
    assert backend.indexed_in_call[0] > 0
    assert m.memory.pending_backlog().count == 0
    # The second batch's write: nothing else to consolidate, and closing does not wait.
    assert m.observer.index_holds == ["backend_wait", "cancelled"]


def test_a_write_waits_no_longer_than_its_bound_while_flushes_keep_working() -> None:
    m = InMemoryMemoryd()
    foreground = ForegroundWork()
    flusher = m.flusher(FlakyBackend(), index_yield_s=0.05, foreground=foreground)
    with foreground.working(), foreground.waiting(), foreground.working():
        flusher.flush(key_of("ada"), buffered([make_event("ada", "I live in Lisbon")]), attempt=0)
        deadline = time.monotonic() + LONG_S
        while m.memory.pending_backlog().count and time.monotonic() < deadline:
            time.sleep(0.005)
        assert m.memory.pending_backlog().count == 0
    flusher.close()
    assert m.observer.index_holds == ["bound"]


def test_a_waiter_told_to_stop_returns_at_once() -> None:
    foreground = ForegroundWork()
    cancel = threading.Event()
    released: list[Release] = []
    waiter = threading.Thread(
        target=lambda: released.append(foreground.wait_for_quiet(LONG_S, cancel))
    )
    with foreground.working():
        waiter.start()
        cancel.set()
        foreground.wake()
        waiter.join(LONG_S)
    assert released == [Release.CANCELLED]
