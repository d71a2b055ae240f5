"""Pausing a consumer's fetches while it holds too many events, and resuming them."""

from __future__ import annotations

from consumers.kafka_client import EventConsumer


class Backpressure:
    """Paused at `max_held` events held, resumed below half of it (hysteresis, so one flush
    finishing does not flap the pause)."""

    def __init__(self, consumer: EventConsumer, max_held: int) -> None:
        self._consumer = consumer
        self._max_held = max_held
        self.paused = False

    def update(self, held: int) -> None:
        if not self.paused and held >= self._max_held:
            self._consumer.pause(*self._consumer.assignment())
            self.paused = True
        elif self.paused and held < self._max_held // 2:
            self._consumer.resume(*self._consumer.paused())
            self.paused = False

    def assigned(self) -> None:
        """After a rebalance, which dropped what was held. kafka-python keeps the paused flag
        of a partition assigned straight back: left alone, it was never fetched again."""
        self._consumer.resume(*self._consumer.paused())
        self.paused = False
