"""Local services (memoryd.dev) for a test run, on ports picked with free_port().

A picked port is free when picked, not when the service binds it seconds later: a parallel run,
or anything else on the machine, may take it in between. A start that finds its port taken
(PortTaken) is made again on new ports instead of failing the run.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol, TypeVar

from memoryd.dev import DevPorts, LocalKafka, PortTaken
from memoryd.dev.stack import DEFAULT_KAFKA_POM, default_cache_dir

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


def local_kafka(home: Path, ports: tuple[int, int] | None = None) -> LocalKafka:
    """A broker of the test's own in `home`, stopped with the test process: on the given
    (broker, controller) ports, else on free ones; its jars from the shared cache."""
    if ports is None:
        free = DevPorts.free()
        ports = (free.kafka, free.kafka_controller)
    return LocalKafka(
        home,
        *ports,
        pom=DEFAULT_KAFKA_POM,
        jars_cache=default_cache_dir() / "kafka-jars",
        stop_on_exit=True,
    )


@contextmanager
def frozen(kafka: LocalKafka) -> Iterator[None]:
    """The broker stopped with SIGSTOP for the block, then continued: it keeps its ports and
    connections but answers nothing, as a hung broker or a network that drops every packet."""
    assert kafka.pid is not None, "the broker is not running"
    os.kill(kafka.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(kafka.pid, signal.SIGCONT)  # a stopped process cannot handle the SIGTERM of stop
