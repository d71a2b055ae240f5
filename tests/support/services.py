"""Local services (memoryd.dev) for a test run, on ports picked with free_port().

A picked port is free when picked, not when the service binds it seconds later: a parallel run,
or anything else on the machine, may take it in between. A start that finds its port taken
(PortTaken) is made again on new ports instead of failing the run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol

from memoryd.dev import PortTaken

START_ATTEMPTS = 3


class LocalService(Protocol):
    def start(self, timeout: float) -> str: ...

    def stop(self) -> None: ...


@contextmanager
def running(make: Callable[[], LocalService], timeout: float) -> Iterator[str]:
    """The address of a service from make() (which picks its ports) while it runs; stopped
    afterwards. A start on a taken port is tried again with a new service from make()."""
    service, address = _start(make, timeout)
    try:
        yield address
    finally:
        service.stop()


def _start(make: Callable[[], LocalService], timeout: float) -> tuple[LocalService, str]:
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
