"""`memoryd_dead_letters_total{cause}`: why records were dead-lettered, in a bounded set of
classes per stage (the free-text reason stays in the letter's header)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from consumers.batching import Rejection
from consumers.dead_letter import CAUSES, PROCESSOR_STAGES, DeadLetter
from consumers.log_writer import LogWriter
from consumers.metrics import PipelineMetrics
from consumers.processor import MemoryProcessor
from processors.errors import BackendError, BackendFailure, TransientBackendError, UnusableAnswer
from store.inmemory.logs import InMemoryEventLog
from tests.support.builders import key_of, make_event
from tests.support.fakes import FakeConsumer, FlakyBackend, ListDeadLetters
from tests.support.inmemory import FAST, SUBJECTS, TOPIC, InMemoryMemoryd, step_until

LETTERS = "memoryd_dead_letters_total"


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (TransientBackendError("503"), "server_error"),
        (TransientBackendError("429", failure=BackendFailure.RATE_LIMITED), "rate_limited"),
        (TransientBackendError("read timed out", failure=BackendFailure.TIMEOUT), "timeout"),
        (UnusableAnswer("output is not JSON"), "unusable_answer"),
        (BackendError("403 API key not valid"), "refused"),
    ],
)
def test_a_backend_rejection_is_classed_by_the_error(error: BackendError, cause: str) -> None:
    rejection = Rejection.of_backend(f"backend error: {error}", error)
    assert (rejection.stage, rejection.cause) == ("consolidate", cause)


@pytest.mark.parametrize(
    ("status", "failure"),
    [(429, "rate_limited"), (408, "timeout"), (504, "timeout"), (500, "server_error")],
)
def test_a_retried_http_status_is_classed(status: int, failure: str) -> None:
    assert BackendFailure.of_status(status) == failure


def test_every_stage_has_a_small_fixed_set_of_causes() -> None:
    assert set(CAUSES) == set(PROCESSOR_STAGES)
    assert all(0 < len(causes) <= 10 for causes in CAUSES.values())


def test_a_letter_takes_no_cause_outside_its_stage_s_set() -> None:
    def letter(stage: str, cause: str = "") -> DeadLetter:
        return DeadLetter(None, b"x", stage, "free text", TOPIC, 0, 0, cause)

    assert letter("decode").cause == "decode"  # a stage of one cause names it itself
    assert letter("validate").cause == "validation"
    assert letter("consolidate", "timeout").cause == "timeout"
    for stage, cause in [("consolidate", ""), ("consolidate", "free text"), ("decode", "x")]:
        with pytest.raises(ValueError, match="no dead-letter cause"):
            letter(stage, cause)


@pytest.mark.parametrize(
    ("failures", "credit", "stage", "cause"),
    [
        pytest.param(
            [TransientBackendError("429", failure=BackendFailure.RATE_LIMITED)] * 5,
            None,
            "consolidate",
            "rate_limited",
            id="rate limited until the attempts ran out",
        ),
        pytest.param([BackendError("403")], None, "consolidate", "refused", id="refused"),
        pytest.param(
            [UnusableAnswer("not JSON")], None, "consolidate", "unusable_answer", id="unusable"
        ),
        pytest.param([RuntimeError("bug")], None, "consolidate", "unexpected", id="a bug"),
        pytest.param([], 0, "budget", "credit", id="out of credit"),
    ],
)
def test_the_processor_counts_its_dead_letters_by_cause(
    failures: list[BaseException], credit: int | None, stage: str, cause: str
) -> None:
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    if credit is not None:
        m.memory.set_credit(key_of("ada"), credit)
    registry = CollectorRegistry()
    settings = FAST.model_copy(update={"max_attempts": 3})
    processor = MemoryProcessor(
        consumer,
        TOPIC,
        m.flusher(FlakyBackend(failures), settings.budget_policy),
        letters,
        PipelineMetrics(registry),
        settings,
    )
    event = make_event("ada", "I live in Lisbon")
    consumer.produce(0, event.to_bytes(), event.kafka_key)
    processor.start()
    try:
        step_until(processor, lambda: consumer.committed.get(0) == 1)
    finally:
        processor.shutdown()

    assert [(x.stage, x.cause) for x in letters.letters] == [(stage, cause)]
    counted = {
        (s, c): registry.get_sample_value(
            LETTERS, {"consumer": "processor", "stage": s, "cause": c}
        )
        for s in PROCESSOR_STAGES
        for c in CAUSES[s]
    }
    # Every class exists from the start (at 0), and only this one counted the letter.
    assert counted == {k: float(k == (stage, cause)) for k in counted}


def test_the_log_writer_counts_its_dead_letters_by_cause() -> None:
    m, consumer, letters = InMemoryMemoryd(), FakeConsumer(TOPIC), ListDeadLetters()
    consumer.produce(0, b"not json", None)
    consumer.produce(0, b'{"event_id": "x"}', None)
    registry = CollectorRegistry()
    writer = LogWriter(
        consumer, TOPIC, InMemoryEventLog(m.db, SUBJECTS), letters, PipelineMetrics(registry)
    )
    writer.drain(idle_s=0.0, deadline_s=10.0)

    def count(stage: str, cause: str) -> float | None:
        labels = {"consumer": "log-writer", "stage": stage, "cause": cause}
        return registry.get_sample_value(LETTERS, labels)

    assert (count("decode", "decode"), count("validate", "validation")) == (1.0, 1.0)
