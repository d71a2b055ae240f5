"""Consumer lag as the broker sees it: each partition's end offset minus the group's commit.

Unlike an in-process count, this includes what no consumer has read yet, and it keeps being
right when every consumer of a group is down. A partition the group never committed counts
from the partition's earliest offset, where `auto_offset_reset=earliest` would start.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kafka.admin import KafkaAdminClient, OffsetSpec
from kafka.errors import KafkaError
from kafka.structs import TopicPartition

from consumers.errors import ConsumerError


class KafkaUnavailable(ConsumerError):
    """The brokers did not answer an admin request in time."""


@dataclass(frozen=True)
class PartitionLag:
    consumer: str  # the label: log-writer, processor
    partition: int
    end_offset: int
    committed: int | None  # None: the group never committed this partition
    lag: int


class KafkaAdmin:
    """One admin client per process, made on first use and again after a failure.

    kafka-python's clients are not thread-safe: the health checks and the lag job share this
    one under a lock.
    """

    def __init__(self, make: Callable[[], KafkaAdminClient]) -> None:
        self._make = make
        self._client: KafkaAdminClient | None = None
        self._lock = threading.Lock()

    def call(self, fn: Callable[[KafkaAdminClient], Any]) -> Any:
        with self._lock:
            try:
                if self._client is None:
                    self._client = self._make()
                return fn(self._client)
            except (KafkaError, OSError) as e:
                self._drop()
                raise KafkaUnavailable(f"{type(e).__name__}: {e}") from e

    def ping(self) -> None:
        self.call(lambda admin: admin.describe_cluster())

    def _drop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            # Discarded because it failed already: an error closing it changes nothing.
            with contextlib.suppress(KafkaError, OSError):
                client.close()

    def close(self) -> None:
        with self._lock:
            self._drop()


def _partitions(admin: KafkaAdminClient, topic: str) -> list[int]:
    described = admin.describe_topics([topic])
    out: list[int] = []
    for entry in described:
        for p in entry.get("partitions", []):
            index = p.get("partition_index", p.get("partition"))
            if index is not None:
                out.append(int(index))
    return sorted(out)


class ConsumerLagProbe:
    def __init__(self, admin: KafkaAdmin, topic: str, groups: Mapping[str, str]) -> None:
        """`groups` maps a label (log-writer, processor) to its consumer group id."""
        self._admin = admin
        self._topic = topic
        self._groups = dict(groups)

    def measure(self) -> list[PartitionLag]:
        return list(self._admin.call(self._measure))

    def _measure(self, admin: KafkaAdminClient) -> list[PartitionLag]:
        tps = [TopicPartition(self._topic, p) for p in _partitions(admin, self._topic)]
        if not tps:
            return []
        end = admin.list_partition_offsets(dict.fromkeys(tps, OffsetSpec.LATEST))
        start = admin.list_partition_offsets(dict.fromkeys(tps, OffsetSpec.EARLIEST))
        committed = admin.list_group_offsets(dict.fromkeys(self._groups.values(), tps))
        out = []
        for label, group in sorted(self._groups.items()):
            offsets = committed.get(group, {})
            for tp in tps:
                end_offset = int(end[tp].offset)
                meta = offsets.get(tp)
                position = None if meta is None or meta.offset < 0 else int(meta.offset)
                base = int(start[tp].offset) if position is None else position
                out.append(
                    PartitionLag(
                        label, tp.partition, end_offset, position, max(0, end_offset - base)
                    )
                )
        return out
