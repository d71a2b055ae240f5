"""Local services (memoryd.dev) for a test run, on ports picked with free_port().

A picked port is free when picked, not when the service binds it seconds later: a parallel run,
or anything else on the machine, may take it in between. A start that finds its port taken
(PortTaken) is made again on new ports instead of failing the run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol, TypeVar

from memoryd.dev import PortTaken

START_ATTEMPTS = 3


class LocalService(Protocol):
    def start(self, timeout: float) -> str: ...

    def stop(self) -> None: ...


S = TypeVar("S", bound=LocalService)


@contextmanager
def running(make: Callable[[], LocalService], timeout: float) -> Iterator[str]:
    """The address of a service from make() (which picks its ports) while it runs; stopped
    afterwards. A start on a taken port is tried again with a new service from make()."""
    service, address = _start(make, timeout)
    try:
        yield address
    finally:
        service.stop()


@contextmanager
def started(make: Callable[[], S], timeout: float) -> Iterator[S]:
    """As running(), for a test that handles the service itself (stops it, starts it again on
    the same port): the service from make() that started."""
    service = start(make, timeout)
    try:
        yield service
    finally:
        service.stop()


def start(make: Callable[[], S], timeout: float) -> S:
    """A started service from make(), for a caller that stops it in its own time (or never:
    a process that leaves it to the service's watchdog)."""
    return _start(make, timeout)[0]


def _start(make: Callable[[], S], timeout: float) -> tuple[S, str]:
    attempt = 1
    while True:
        service = make()
        try:
            return service, service.start(timeout=timeout)
        except BaseException as e:
            service.stop()  # what a failed start left running, its watchdog included
            if not isinstance(e, PortTaken) or attempt == START_ATTEMPTS:
                raise
        attempt += 1
