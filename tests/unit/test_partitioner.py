"""A memory's records go to the partition Kafka's default partitioner picks, hash remembered."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from kafka.partitioner import DefaultPartitioner

from producers.partitioner import RememberingPartitioner


class _Cluster:
    def __init__(self, partitions: set[int]) -> None:
        self._partitions = partitions

    def topics(self) -> set[str]:
        return {"events"}

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return self._partitions if topic == "events" else None

    def available_partitions_for_topic(self, topic: str) -> set[int]:
        return self._partitions


@given(st.lists(st.binary(max_size=64), min_size=1, max_size=50), st.integers(1, 64))
def test_every_key_lands_where_the_default_partitioner_puts_it(
    keys: list[bytes], count: int
) -> None:
    cluster = _Cluster(set(range(count)))
    remembering, default = RememberingPartitioner(kept=8), DefaultPartitioner()
    for key in [*keys, *keys]:  # the second time from the remembered hash
        expected = default.partition("events", key, key, None, None, cluster)
        assert remembering.partition("events", key, key, None, None, cluster) == expected


def test_the_remembered_hashes_stay_bounded_and_follow_a_repartitioned_topic() -> None:
    partitioner = RememberingPartitioner(kept=4)
    keys = [f"acme\x1fuser-{i}".encode() for i in range(10)]
    for key in keys:
        partitioner.partition("events", key, key, None, None, _Cluster(set(range(6))))
    assert len(partitioner) <= 4
    grown, default = _Cluster(set(range(12))), DefaultPartitioner()
    for key in keys:
        expected = default.partition("events", key, key, None, None, grown)
        assert partitioner.partition("events", key, key, None, None, grown) == expected
