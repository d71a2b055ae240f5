"""Letters for records a consumer gives up on, each sent with the commit that passes it.

The processor gives up on records that do not decode and on events whose consolidation failed
for good. A letter waits until every record before its own in the partition is done (or is
itself waiting as a letter); then the due letters go to the dead-letter topic in one Kafka
transaction with the offset past them (`DeadLetterSink`). A crash before that transaction
commits leaves neither the letters nor the offset, and the records are read and lettered again
once; a crash after it leaves both. While the topic is away the letters wait (and their
records' offsets stay open, so nothing past them is committed); each later step tries again
after the outage's backoff. The process keeps consolidating everything else meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from typing import Any

from consumers.batching import OffsetTracker, TopicPartition
from consumers.dead_letter import READ_STAGES, DeadLetter, DeadLetterSink
from consumers.errors import DeadLetterError
from consumers.log_fields import letter_fields
from consumers.metrics import PipelineMetrics
from consumers.outage import Outage

log = logging.getLogger(__name__)
SENDING = "dead letters"  # the outage source


class HeldLetters:
    def __init__(
        self,
        sink: DeadLetterSink,
        consumer: str,
        metrics: PipelineMetrics,
        outage: Outage,
        monotonic: Callable[[], float],
        group: Callable[[], Any],
    ) -> None:
        self._sink = sink
        self._consumer = consumer
        self._metrics = metrics
        self._outage = outage
        self._monotonic = monotonic
        self._group = group  # the consumer's group metadata, read when a transaction starts
        self._waiting: list[DeadLetter] = []
        self._not_before = 0.0
        # (memory key, partition) -> offset of its latest tombstone read, kept while a record
        # of the memory below it may still be open: a batch in flight when the tombstone came
        # hands its letters over after it (`wait`).
        self._tombstones: dict[tuple[bytes, TopicPartition], int] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def wait(self, letters: Sequence[DeadLetter]) -> list[DeadLetter]:
        """Hold `letters` until they are due; returns those a tombstone read before them
        forgot, which are not held (the caller marks their records done)."""
        forgotten = [x for x in letters if self._forgotten(x)]
        self._waiting.extend(x for x in letters if not self._forgotten(x))
        return forgotten

    def _forgotten(self, letter: DeadLetter) -> bool:
        if letter.key is None or letter.stage in READ_STAGES:
            return False  # a record that did not decode is no memory's event
        before = self._tombstones.get((letter.key, _partition(letter)))
        return before is not None and letter.offset < before

    def drop(self, partitions: Collection[TopicPartition]) -> None:
        """Forget the letters of partitions no longer ours: their next owner reads those
        records again."""
        self._waiting = [x for x in self._waiting if _partition(x) not in partitions]
        self._tombstones = {k: v for k, v in self._tombstones.items() if k[1] not in partitions}
        if not self._waiting:
            self._outage.recovered(SENDING)  # nothing is left to send: not failing any more

    def forget(self, key: bytes, tp: TopicPartition, before: int) -> list[DeadLetter]:
        """Take out and return the letters of a memory's events read from `tp` below `before`,
        its tombstone's offset: the erasure forgot those events, and sent now their letters
        would copy them to the dead-letter topic after it. The caller marks them done. The
        tombstone is kept for the letters of a batch still in flight, handed over later."""
        self._tombstones[(key, tp)] = max(before, self._tombstones.get((key, tp), before))
        gone = [x for x in self._waiting if self._forgotten(x)]
        if gone:
            self._waiting = [x for x in self._waiting if not self._forgotten(x)]
            if not self._waiting:
                self._outage.recovered(SENDING)
        return gone

    def send_due(self, offsets: OffsetTracker) -> list[DeadLetter]:
        """Send the letters whose records lead their partition's open offsets, with the
        offsets past them, and mark those records done; returns what was sent."""
        # A tombstone is needed no more once every record of its partition below it is done.
        self._tombstones = {
            k: before
            for k, before in self._tombstones.items()
            if (offsets.position(k[1]) or 0) < before
        }
        if not self._waiting or self._monotonic() < self._not_before:
            return []
        mine: dict[TopicPartition, dict[int, DeadLetter]] = {}
        for x in self._waiting:
            mine.setdefault(_partition(x), {})[x.offset] = x
        due: list[DeadLetter] = []
        consumed: dict[TopicPartition, int] = {}
        for tp, letters in mine.items():
            leading = offsets.leading_open(tp, letters.keys())
            if leading:
                due.extend(letters[o] for o in leading)
                consumed[tp] = leading[-1] + 1
        if not due:
            return []
        try:
            self._sink.send(due, consumed, self._group())
        except DeadLetterError as e:
            self._not_before = self._monotonic() + self._outage.failed(e, SENDING)
            return []
        # By record, not by letter: a record read twice (a fetch repeated) waits twice.
        sent = {(_partition(x), x.offset) for x in due}
        self._waiting = [x for x in self._waiting if (_partition(x), x.offset) not in sent]
        for x in due:
            offsets.done(_partition(x), x.offset)
            self._metrics.dead_letters.labels(self._consumer, x.stage, x.cause).inc()
            log.warning("dead-lettered a record: %s", x.reason, extra=letter_fields(x))
        offsets.committed(consumed)
        self._outage.recovered(SENDING)
        return due


def _partition(letter: DeadLetter) -> TopicPartition:
    return TopicPartition(letter.topic, letter.partition)
