"""What an erasure takes away from the pipeline: a forgotten memory's events before its tombstone.

`memoryd forget` records, per partition, the first offset that is not forgotten (the
tombstone's own offset on its partition). A consumer may hold events it read before that
happened (buffered, retrying, or read again by a new group from offset 0): a flush checks,
under the memory's lock, which of its events are forgotten, and waits while the erasure is
still running, so nothing it writes can bring the erased memory back.
"""

from __future__ import annotations

from collections.abc import Sequence

from consumers.batching import BufferedEvent
from domain.ids import MemoryKey, SubjectHasher
from store.errors import MemoryBeingErased
from store.write.erasure_log import PostgresErasureLog
from store.write.memory_store import PostgresMemoryStore


class ForgottenEvents:
    def __init__(
        self, memory: PostgresMemoryStore, erasures: PostgresErasureLog, subjects: SubjectHasher
    ) -> None:
        self._memory = memory
        self._erasures = erasures
        self._subjects = subjects

    def remembered(self, key: MemoryKey, items: Sequence[BufferedEvent]) -> list[BufferedEvent]:
        """The items an erasure did not forget. Call it holding the memory's lock.

        Raises MemoryBeingErased while an erasure of the memory is under way: what it will
        keep (events after its tombstone) is only known once it is done.
        """
        if self._erasures.memory_erasure_open(key):
            raise MemoryBeingErased(f"memory {key} is being erased")
        cutoffs = self._memory.forgotten_before(self._subjects(key))
        if not cutoffs:
            return list(items)
        return [i for i in items if i.offset >= cutoffs.get((i.tp.topic, i.tp.partition), -1)]
