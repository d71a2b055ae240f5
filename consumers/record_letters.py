"""Letters for records no consumer can use, held until the dead-letter topic takes them.

The processor dead-letters the records that do not decode as it polls them. While the topic
is away the letters wait here (and their records' offsets stay open, so nothing past them is
committed); each later step tries again after the outage's backoff. The process keeps
running and consolidating everything else meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

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
        self._not_before = 0.0

    def __len__(self) -> int:
        return len(self._held)

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
