"""Letters for records no consumer can use, held until the dead-letter topic takes them.

The processor dead-letters the records that do not decode once their partition is done up to
them, just before the commit that moves past them. Sent as they were read, a letter waited for
that commit until every record before it was consolidated, and a crash in between read the
record again and lettered it twice. While the topic is away the letters wait here (and their
records' offsets stay open, so nothing past them is committed); each later step tries again
after the outage's backoff. The process keeps running and consolidating everything else
meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence

from consumers.batching import TopicPartition
from consumers.dead_letter import DeadLetter, DeadLetterSink
from consumers.errors import DeadLetterError
from consumers.log_fields import letter_fields
from consumers.metrics import PipelineMetrics
from consumers.outage import Outage

log = logging.getLogger(__name__)


class HeldLetters:
    def __init__(
        self,
        sink: DeadLetterSink,
        consumer: str,
        metrics: PipelineMetrics,
        outage: Outage,
        monotonic: Callable[[], float],
    ) -> None:
        self._sink = sink
        self._consumer = consumer
        self._metrics = metrics
        self._outage = outage
        self._monotonic = monotonic
        self._held: list[DeadLetter] = []
        self._waiting: list[DeadLetter] = []  # not due: records before them are still open
        self._not_before = 0.0

    def __len__(self) -> int:
        return len(self._held)

    def wait(self, letters: Sequence[DeadLetter]) -> None:
        self._waiting.extend(letters)

    def drop(self, partitions: Collection[TopicPartition]) -> None:
        """Forget the waiting letters of partitions no longer ours: their next owner reads
        those records again."""
        self._waiting = [x for x in self._waiting if _partition(x) not in partitions]

    def send_due(
        self,
        position: Callable[[TopicPartition], int | None],
        done: Callable[[TopicPartition, int], None],
    ) -> None:
        """Send the waiting letters whose record is the earliest open one of its partition
        (`position`), and the held ones; each sent letter's record is then `done`, which may
        make the next letter of its partition due."""
        while True:
            due: list[DeadLetter] = []
            waiting: list[DeadLetter] = []
            for x in self._waiting:
                (due if position(_partition(x)) == x.offset else waiting).append(x)
            self._waiting = waiting
            sent = self.send(due)
            for x in sent:
                done(_partition(x), x.offset)
            if not sent:
                return

    def send(self, letters: Sequence[DeadLetter] = ()) -> list[DeadLetter]:
        """Hold `letters` too, then try to send what is held; returns what was sent."""
        self._held.extend(letters)
        if not self._held or self._monotonic() < self._not_before:
            return []
        try:
            self._sink.send(self._held)
        except DeadLetterError as e:
            self._not_before = self._monotonic() + self._outage.failed(e, "dead letters")
            return []
        sent, self._held = self._held, []
        for x in sent:
            self._metrics.dead_letters.labels(self._consumer, x.stage).inc()
            log.warning("dead-lettered a record: %s", x.reason, extra=letter_fields(x))
        self._outage.recovered()
        return sent


def _partition(letter: DeadLetter) -> TopicPartition:
    return TopicPartition(letter.topic, letter.partition)
