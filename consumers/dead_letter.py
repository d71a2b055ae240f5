"""The dead-letter topic: records memoryd could not use, with the reason in their headers.

The original key and value are kept byte for byte, so `memoryd redrive` can put a record back
exactly as it was once the cause is fixed. Two records cannot be kept: one with neither key
nor value (Kafka takes none such from a producer; the letter's value is empty), and one within
a letter's headers of the producer's size limit or over the dead-letter topic's own (the letter
leaves key and value out and says how large they were, `dlq.omitted`; the record stays where
its source headers point, until retention). Either, refused, stalled its partition for good.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kafka import KafkaProducer
from kafka.errors import KafkaError, KafkaTimeoutError, MessageSizeTooLargeError
from kafka.structs import ConsumerGroupMetadata, OffsetAndMetadata
from kafka.structs import TopicPartition as KafkaTopicPartition

from consumers.batching import BufferedEvent, TopicPartition
from consumers.errors import DeadLetterError
from processors.errors import BackendFailure
from producers.kafka_clients import close_now, open_client

log = logging.getLogger(__name__)
HEADER_REASON = "dlq.reason"
HEADER_STAGE = "dlq.stage"
HEADER_TOPIC = "dlq.source.topic"
HEADER_PARTITION = "dlq.source.partition"
HEADER_OFFSET = "dlq.source.offset"
HEADER_CONSUMER = "dlq.consumer"
HEADER_OMITTED = "dlq.omitted"
# Where a record is dead-lettered (`dlq.stage`): any consumer of the topic can fail to decode
# or validate it; only the processor consolidates and applies a budget.
READ_STAGES = ("decode", "validate")
PROCESSOR_STAGES = (*READ_STAGES, "consolidate", "budget")
# Why, in a few words a metric can be labelled by (`memoryd_dead_letters_total{cause}`), per
# stage: the reason itself is free text, for the header. A consolidation that failed says what
# the backend did (`processors.errors.BackendFailure`), or `unexpected`: a bug in memoryd.
UNEXPECTED = "unexpected"
CAUSES: dict[str, tuple[str, ...]] = {
    "decode": ("decode",),
    "validate": ("validation",),
    "consolidate": (*BackendFailure, UNEXPECTED),
    "budget": ("credit",),
}


@dataclass(frozen=True)
class DeadLetter:
    key: bytes | None
    value: bytes | None
    stage: str
    reason: str
    topic: str
    partition: int
    offset: int
    # One of the stage's `CAUSES`; a stage with one cause names it itself.
    cause: str = ""

    def __post_init__(self) -> None:
        causes = CAUSES[self.stage]
        if not self.cause and len(causes) == 1:
            object.__setattr__(self, "cause", causes[0])
        if self.cause not in causes:
            # A label value out of the bounded set would make a series of its own.
            raise ValueError(f"no dead-letter cause {self.cause!r} at stage {self.stage!r}")

    def headers(self, consumer: str) -> list[tuple[str, bytes]]:
        return [
            (HEADER_REASON, self.reason.encode()),
            (HEADER_STAGE, self.stage.encode()),
            (HEADER_TOPIC, self.topic.encode()),
            (HEADER_PARTITION, str(self.partition).encode()),
            (HEADER_OFFSET, str(self.offset).encode()),
            (HEADER_CONSUMER, consumer.encode()),
        ]


def event_letters(
    items: Sequence[BufferedEvent],
    stage: str,
    reason: str,
    reasons: Mapping[uuid.UUID, str] | None = None,
    *,
    cause: str,
) -> list[DeadLetter]:
    """Dead letters for valid events a consumer gives up on, each at its source offset;
    `reasons` gives some events a reason of their own (a bisected batch's)."""
    own = reasons or {}
    return [
        DeadLetter(
            i.event.kafka_key,
            i.event.to_bytes(),
            stage,
            own.get(i.event.event_id, reason),
            i.tp.topic,
            i.tp.partition,
            i.offset,
            cause,
        )
        for i in items
    ]


class DeadLetterSink(Protocol):
    def send(
        self, letters: Sequence[DeadLetter], consumed: Mapping[TopicPartition, int], group: Any
    ) -> None:
        """Write every letter and commit the consumer group's positions `consumed` (partition
        -> next offset to read) in one Kafka transaction, or raise `DeadLetterError`; then
        neither is visible. `group` is the consumer's `group_metadata()`."""

    def close(self) -> None: ...


# A transaction here takes milliseconds. One left open by a killed process holds back every
# read_committed reader of the dead-letter topic until the broker aborts it, this long after
# it began (and the broker's next check for timed-out transactions).
TRANSACTION_TIMEOUT_MS = 10_000


class _Refused(Exception):
    """The broker refused a letter as larger than the topic's limit (`index` in the letters
    sent, None when sent together: then which one is not known); `bare` if that letter had
    already been sent without its bytes."""

    def __init__(self, error: BaseException, index: int | None, bare: bool) -> None:
        super().__init__(repr(error))
        self.error, self.index, self.bare = error, index, bare


class KafkaDeadLetterSink:
    """Letters and the offsets that move past their records, committed together.

    Sent and then committed separately, a crash in between read the records again and
    lettered them twice; in one transaction, a crash leaves neither (readers of the topic
    read committed records only). The consumer group's generation (KIP-447) fences a consumer
    that lost its partitions, and a killed process's open transaction is aborted after
    `TRANSACTION_TIMEOUT_MS`.

    A letter the broker refuses as too large for the topic is sent again without its bytes,
    in a new transaction; if even that is refused, nothing commits (an outage). Every wait on
    the broker is bounded by `timeout_s`.
    """

    def __init__(
        self, bootstrap_servers: str, topic: str, consumer_name: str, timeout_s: float = 30.0
    ) -> None:
        self._bootstrap_servers = bootstrap_servers
        self._topic = topic
        self._consumer_name = consumer_name
        self._timeout_s = timeout_s
        # One transactional id for the sink's life, not one per producer: a producer dropped
        # after a failure is fenced by the next one's init_transactions, which also ends at
        # once whatever transaction it left open (else it held read_committed readers back
        # until TRANSACTION_TIMEOUT_MS), and the coordinator keeps one id's state per sink
        # instead of one per retry. Random per sink, not fixed per consumer name: two sinks of
        # one name (a process restarted while the old one still runs, tests) would fence each
        # other's live transactions; KIP-447 fencing does not need the id to be stable.
        self._transactional_id = f"memoryd-{consumer_name}-dlq-{uuid.uuid4().hex}"
        self._producer: Any = self._new_producer()
        self._initialised = False
        # The letters of a transaction begun and not yet committed or aborted: a send cut short
        # by an error of no Kafka kind leaves it open, for `close` to abort.
        self._open: Sequence[DeadLetter] = ()

    def send(
        self, letters: Sequence[DeadLetter], consumed: Mapping[TopicPartition, int], group: Any
    ) -> None:
        if not letters:
            return
        if isinstance(group, ConsumerGroupMetadata) and (
            group.generation_id < 0 or not group.member_id
        ):
            # Evicted from the group (kafka-python resets the generation to -1 and the member
            # id to ''): the broker takes a transactional commit with neither as an admin's and
            # fences nothing, so this consumer would letter records, and commit offsets, of
            # partitions another member owns now.
            raise DeadLetterError(
                f"{len(letters)} dead letter(s) not sent: the consumer is not in its group"
                f" (generation {group.generation_id}, member {group.member_id!r})"
            )
        bare: set[int] = set()
        one_by_one = len(letters) == 1
        # Each round either learns which letter the broker refuses (sent one by one, it is the
        # one that failed) and sends it bare next time, or ends: at most len(letters) + 2.
        while True:
            try:
                self._transact(letters, bare, consumed, group, one_by_one)
                return
            except _Refused as refused:
                # kafka-python puts the transaction in an abortable error: it cannot commit.
                self._abort()
                if refused.bare:
                    raise DeadLetterError(
                        f"{len(letters)} dead letter(s) not committed: the topic refuses even"
                        f" a letter without its record's bytes: {refused.error!r}"
                    ) from refused.error
                if refused.index is None:
                    one_by_one = True
                else:
                    log.warning(
                        "dead letter for %s/%d@%d refused by the broker as too large: sent"
                        " without its bytes",
                        letters[refused.index].topic,
                        letters[refused.index].partition,
                        letters[refused.index].offset,
                    )
                    bare.add(refused.index)
            except KafkaError as e:
                self._abort()
                raise DeadLetterError(f"{len(letters)} dead letter(s) not committed: {e!r}") from e

    def _transact(
        self,
        letters: Sequence[DeadLetter],
        bare: set[int],
        consumed: Mapping[TopicPartition, int],
        group: Any,
        one_by_one: bool,
    ) -> None:
        """One transaction: every letter (those in `bare` without their bytes), then the
        offsets, then the commit; raises `_Refused` or the `KafkaError` that stopped it."""
        producer = self._ready()
        producer.begin_transaction()
        self._open = letters
        futures = []
        for i, letter in enumerate(letters):
            future, sent_bare = self._send_one(producer, letter, bare=i in bare)
            if one_by_one:
                try:
                    future.get(timeout=self._timeout_s)
                except MessageSizeTooLargeError as e:
                    raise _Refused(e, i, sent_bare) from e
            futures.append(future)
        # Every letter's own outcome, before anything commits: kafka-python 3.0.12 commits a
        # transaction whose record expired unsent (a retriable error changes no state). Each
        # future, not `flush()`: that raises UnknownError once the broker made it split a batch.
        deadline = time.monotonic() + self._timeout_s
        errors: list[KafkaError] = []
        for future in futures:
            try:
                future.get(timeout=max(0.0, deadline - time.monotonic()))
            except KafkaError as e:
                errors.append(e)
        for error in errors:
            # Sent together, a refused letter's error also fails the letters not yet sent
            # (the transaction is aborted): which letter it was is not known.
            if isinstance(error, MessageSizeTooLargeError):
                raise _Refused(error, None, bare=False)
        if errors:
            raise errors[0]
        if consumed:
            offsets = {
                KafkaTopicPartition(tp.topic, tp.partition): OffsetAndMetadata(pos, "", -1)
                for tp, pos in consumed.items()
            }
            bounded(
                lambda t: t.send_offsets_to_transaction(offsets, group), producer, self._timeout_s
            )
        self._commit(producer)

    def _commit(self, producer: Any) -> None:
        try:
            bounded(lambda t: t.begin_commit(), producer, self._timeout_s)
            self._open = ()
        except KafkaTimeoutError:
            # Committing, the transaction can no longer be aborted: the next producer's
            # init_transactions (same id) waits for it to end either way. If it did commit,
            # the letters go again, doubled (at least once).
            self._drop()
            raise

    def _send_one(self, producer: Any, letter: DeadLetter, bare: bool) -> tuple[Any, bool]:
        """The letter's future, and whether it went without its bytes (`bare`, or over the
        producer's own size limit)."""
        headers = letter.headers(self._consumer_name)
        value = b"" if letter.key is None and letter.value is None else letter.value
        if not bare:
            # Over the producer's own limit, `send` raises at once (the letter never reached
            # the broker): then it goes without its bytes, below.
            with contextlib.suppress(MessageSizeTooLargeError):
                whole = producer.send(self._topic, key=letter.key, value=value, headers=headers)
                return whole, False
        sizes = f"key={len(letter.key or b'')} value={len(letter.value or b'')} bytes"
        omitted = [*headers, (HEADER_OMITTED, sizes.encode())]
        return producer.send(self._topic, key=None, value=b"", headers=omitted), True

    def _new_producer(self) -> Any:
        return open_client(
            KafkaProducer,
            bootstrap_servers=self._bootstrap_servers,
            client_id=f"{self._consumer_name}-dlq",
            transactional_id=self._transactional_id,
            transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
            acks="all",
            max_block_ms=int(self._timeout_s * 1000),
            delivery_timeout_ms=int(self._timeout_s * 1000),
            request_timeout_ms=min(int(self._timeout_s * 1000), 10_000),
        )

    def _ready(self) -> Any:
        """The producer, its transactions initialised (on the first letter, not at start)."""
        if self._producer is None:
            self._producer = self._new_producer()
        if not self._initialised:
            self._producer.init_transactions()
            self._initialised = True
        return self._producer

    def _abort(self) -> None:
        """Abort the open transaction and drop the producer: the next send starts a new one.

        Aborted, the failed transaction holds back no read_committed reader of the topic until
        the broker times it out. Kept, the producer lost letters: kafka-python 3.0.12 bumps
        its epoch after a refused record (the topic's size limit, say), then the broker
        refuses its next transaction's records as out of sequence, its I/O thread dies, and
        `commit_transaction` returns as if that transaction had committed. Before a
        transaction began (no producer, or its `init_transactions` timed out) there is
        nothing to abort: the next send tries again with the same producer."""
        if self._producer is None or not self._initialised:
            return
        try:
            bounded(lambda t: t.begin_abort(), self._producer, self._timeout_s)
        except KafkaError as e:  # fenced, away, or its state unknown: the next producer ends it
            log.warning("dead-letter transaction not aborted: %r", e)
        self._drop()

    def _drop(self) -> None:
        producer, self._producer, self._initialised = self._producer, None, False
        self._open = ()
        if producer is None:
            return
        try:
            close_now(producer, self._timeout_s)
        except KafkaError as e:  # the letters' outcome is decided already: a leak at worst
            log.warning("dead-letter producer not closed: %r", e)

    def close(self) -> None:
        """Drop the producer, waiting on its broker at most twice `timeout_s`.

        Each send ends its transaction, so the producer holds nothing when the consumer stops,
        unless an error of no Kafka kind cut a send short: kafka-python's own `close()` then
        waited for that transaction's letters with no limit, and with the broker away the
        consumer's process never exited. The transaction is aborted instead: neither its
        letters nor its offsets commit, and their records are read again."""
        if self._open:
            first = self._open[0]
            log.warning(
                "dead-letter sink closed with %d letter(s) not committed, from %s/%d@%d on:"
                " given up, their records are read again",
                len(self._open),
                first.topic,
                first.partition,
                first.offset,
            )
            self._abort()
        else:
            self._drop()


# kafka-python 3.0.12 offers no bounded way to end a transaction: the function below does it with
# the producer's private parts, here alone (and `close_now`, in producers.kafka_clients, drops a
# producer whose broker is away). Check them on any upgrade of kafka-python.


def bounded(begin: Callable[[Any], Any], producer: Any, timeout_s: float) -> None:
    """A transactional step of `producer`, its broker's answer awaited at most `timeout_s`:
    `begin` is given the producer's transaction manager and returns the step's result.

    kafka-python 3.0.12's send_offsets_to_transaction, commit_transaction and
    abort_transaction wait for the coordinator's answer with no limit (their
    `TransactionalRequestResult.wait()` is given none) and offer no timeout: with the
    coordinator unreachable, the I/O thread looks for it again and again and the caller, a
    consumer's poll thread, blocks until its group evicts it. This is their body with the wait
    bounded, on the producer's private `_transaction_manager` and `_sender`."""
    result = begin(producer._transaction_manager)
    producer._sender.wakeup()
    if not result.wait(timeout_ms=timeout_s * 1000):
        raise KafkaTimeoutError(f"no answer from the transaction coordinator in {timeout_s}s")
