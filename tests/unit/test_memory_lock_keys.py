"""The advisory lock keys of memories: 64 bits of a hash, so no tenant can pick a user id
whose lock is another tenant's memory's."""

from __future__ import annotations

import zlib

import pytest

from domain.ids import MemoryKey
from store.write.locks import log_lock_key, memory_lock_key

# Two memories of two organizations whose keys share a crc32, found by trying user ids: what
# a tenant could do to make its memory's lock another tenant's.
ADA = MemoryKey("org-a", "ada-bb8f9dc50a")
MALLORY = MemoryKey("org-b", "mallory-26f0117f9c")
INT64 = (-(2**63), 2**63 - 1)


def test_memories_sharing_a_crc32_have_locks_of_their_own() -> None:
    assert zlib.crc32(ADA.joined.encode()) == zlib.crc32(MALLORY.joined.encode())
    assert memory_lock_key(ADA) != memory_lock_key(MALLORY)
    assert log_lock_key(ADA) != log_lock_key(MALLORY)


@pytest.mark.parametrize("key", [ADA, MALLORY, MemoryKey("o", "u"), MemoryKey("o\u00e9", "u")])
def test_a_key_is_a_bigint_stable_across_calls_and_apart_from_the_log_lock(key: MemoryKey) -> None:
    assert INT64[0] <= memory_lock_key(key) <= INT64[1]
    assert INT64[0] <= log_lock_key(key) <= INT64[1]
    assert memory_lock_key(key) == memory_lock_key(MemoryKey(key.organization_id, key.user_id))
    assert memory_lock_key(key) != log_lock_key(key)


def test_the_upper_half_depends_on_the_memory_too() -> None:
    # A namespace in the upper 32 bits left those bits equal for every memory: all of the
    # key's spread was the checksum's 32 bits.
    uppers = {memory_lock_key(MemoryKey("org", f"user-{i}")) >> 32 for i in range(64)}
    assert len(uppers) > 32
