"""free_port() never hands out a port twice in one process: the kernel's pick is free, not
reserved, until whoever asked binds it, and two services of one run must not get the same."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from memoryd.dev import DevPorts, free_port


def test_a_port_is_handed_out_once() -> None:
    ports = [free_port() for _ in range(1000)]  # the kernel alone repeats itself ~20 times here

    assert len(set(ports)) == len(ports)


def test_a_port_is_handed_out_once_across_threads() -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        ports = list(pool.map(lambda _: free_port(), range(1000)))

    assert len(set(ports)) == len(ports)


def test_dev_ports_are_distinct() -> None:
    assert len(set(vars(DevPorts.free()).values())) == 4
