"""The partition of a memory's records: Kafka's default, with each key's hash remembered.

kafka-python's default partitioner computes the Java client's murmur2 of the key in pure Python
and sorts the topic's partitions for every record; a memory's key is the same on all its events,
so the hash of each key is computed once (up to `KEY_HASHES_KEPT` keys, then the oldest half is
dropped). A producer's CPU per event went from 30 to 24 us (BENCHMARKS, Ingest). The partition
is exactly the default's: murmur2(key) & 0x7fffffff modulo the partition count, over the
partitions in order, so records land where every other Kafka client would put them.
"""

from __future__ import annotations

from typing import Any

from kafka.partitioner import DefaultPartitioner
from kafka.partitioner.default import murmur2

KEY_HASHES_KEPT = 100_000


class RememberingPartitioner(DefaultPartitioner):  # type: ignore[misc]  # kafka-python is untyped
    def __init__(self, kept: int = KEY_HASHES_KEPT) -> None:
        self._kept = kept
        self._hashes: dict[bytes, int] = {}

    def __len__(self) -> int:
        """How many keys' hashes are remembered."""
        return len(self._hashes)

    def partition(
        self,
        topic: str,
        key: Any,
        serialized_key: bytes | None,
        value: Any,
        serialized_value: bytes | None,
        cluster: Any,
    ) -> int:
        if serialized_key is None:
            return int(super().partition(topic, key, None, value, serialized_value, cluster))
        partitions = cluster.partitions_for_topic(topic)
        if not partitions:
            raise ValueError(f"Topic {topic} not found in ClusterMetadata")
        hashed = self._hashes.get(serialized_key)
        if hashed is None:
            hashed = murmur2(serialized_key) & 0x7FFFFFFF
            if len(self._hashes) >= self._kept:
                for old in list(self._hashes)[: self._kept // 2]:  # insertion order: oldest
                    del self._hashes[old]
            self._hashes[serialized_key] = hashed
        ordered = sorted(partitions)
        return int(ordered[hashed % len(ordered)])
