"""What an erasure takes away from the pipeline: a forgotten memory's events before its tombstone.

`memoryd forget` records, per partition, the first offset that is not forgotten (the
tombstone's own offset on its partition). A consumer may hold events it read before that
happened (buffered, retrying, or read again by a new group from offset 0): a flush checks,
under the memory's lock, which of its events are forgotten, and waits while the erasure is
still running, so nothing it writes can bring the erased memory back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager

from consumers.batching import Batch, BufferedEvent, UserBuffers
from domain.ids import MemoryKey
from domain.model import FlushReads
from domain.ports import MemoryStore
from producers.contract import ContextEvent, MemoryTombstone
from store.errors import MemoryBeingErased


def drop_held(
    tombstone: MemoryTombstone, buffers: UserBuffers, batches: MutableMapping[MemoryKey, Batch]
) -> list[BufferedEvent]:
    """A processor met a memory's tombstone: drop what it holds of the memory and has not
    handed to a flush (a running flush checks the cut-offs under the memory lock itself)."""
    key = MemoryKey(tombstone.organization_id, tombstone.user_id)
    dropped = buffers.drop_memory(key)
    batch = batches.get(key)
    if batch is not None and batch.future is None:
        del batches[key]
        dropped += batch.items
    return dropped


def held_events(buffers: UserBuffers, batches: Mapping[MemoryKey, Batch]) -> list[ContextEvent]:
    return [*buffers.events(), *(i.event for b in batches.values() for i in b.items)]


class ForgottenEvents:
    """A flush's first step under the memory lock: its reads of the memory, and its events
    less those an erasure forgot."""

    def __init__(self, memory: MemoryStore, subjects: Callable[[MemoryKey], str]) -> None:
        self._memory = memory
        self._subjects = subjects

    @contextmanager
    def locked(
        self, key: MemoryKey, items: Sequence[BufferedEvent], *, wait: bool = True
    ) -> Iterator[tuple[FlushReads, list[BufferedEvent]]]:
        """Hold the memory's lock; give what the flush needs of the memory, and the items an
        erasure did not forget: not before a memory erasure's cut-offs, and not redacted in
        the log by a fact erasure since the consumer read them.

        Raises MemoryBeingErased while an erasure of the memory is under way: what it will
        keep (events after its tombstone) is only known once it is done.
        """
        ids = list(dict.fromkeys(i.event.event_id for i in items))
        with self._memory.locked_reads(key, self._subjects(key), ids, wait=wait) as reads:
            if reads.erasure_open:
                raise MemoryBeingErased(f"memory {key} is being erased")
            cutoffs = reads.cutoffs
            kept = [
                i
                for i in items
                if i.offset >= cutoffs.get((i.tp.topic, i.tp.partition), -1)
                and i.event.event_id not in reads.erased
            ]
            yield reads, kept
