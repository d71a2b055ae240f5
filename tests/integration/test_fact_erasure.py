"""Erasing one fact on real Kafka, Postgres and Chroma.

The vector index is keyed by fact id alone, so the eraser must refuse a fact id its memory
does not hold (org-b's "mira" has facts of its own that org-a's must not reach), and must
still finish an erasure a crash left midway, whose fact row is already gone.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import replace
from functools import partial
from typing import Any, cast

import pytest

from consumers.kafka_client import end_offsets
from domain.erasure import ErasureScope
from domain.ids import MemoryKey
from domain.ports import VectorIndex
from memoryd import wiring
from memoryd.analyst.commands import live_memory
from memoryd.analyst.invariants import check_deployment
from memoryd.analyst.verify import verify_memory
from memoryd.cli import build_parser
from memoryd.erasure import Eraser, ErasureRequest
from memoryd.erasure_errors import ErasureIncomplete, UnknownFact
from memoryd.ops import runtime
from processors.consolidate import applied_effect
from producers.contract import EventType, Source
from producers.errors import PublishError
from store.errors import VectorIndexUnavailable
from store.read.background import BatchWriter
from store.read.context_service import ContextService
from store.read.fact_queries import PostgresReadModel
from store.write.cluster_jobs import ClusterJobs
from store.write.run_log import PostgresRunLog
from tests.support.builders import key_of, make_event, make_fact, seed_update
from tests.support.chroma import DisposableChroma
from tests.support.deployment import Deployment, on_chroma_server
from tests.support.erasure import erased_as_chroma_stops, rows

pytestmark = pytest.mark.integration

MIRA, TWIN = key_of("mira", "org-a"), key_of("mira", "org-b")
REQUEST = ErasureRequest("test", "asked by the user")


def seed(deployment: Deployment) -> None:
    deployment.publish(
        [
            make_event("mira", "I keep a pet quokka named Bramble", minutes=0, org="org-a"),
            make_event("mira", "I play the cello on Sundays", minutes=1, org="org-a"),
            make_event("mira", "I grow tomatoes on my balcony", minutes=0, org="org-b"),
        ]
    )
    deployment.run_both()
    deployment.with_core(lambda c: wiring.indexer(c).drain_pending())


@contextmanager
def eraser(deployment: Deployment) -> Iterator[tuple[wiring.Core, Eraser]]:
    with wiring.core(deployment.settings) as c, closing(wiring.publisher(c.settings)) as pub:
        yield c, wiring.eraser(c, pub)


def fact_ids(c: wiring.Core, key: MemoryKey) -> list[uuid.UUID]:
    return [f.fact_id for f in c.memory.facts(key)]


def audit(dsn: str) -> list[str]:
    return [r[0] for r in rows(dsn, "SELECT status FROM erasure_audit ORDER BY id")]


@contextmanager
def erasure_gauges(c: wiring.Core) -> Iterator[Callable[[], tuple[float | None, bool]]]:
    """Measures the cluster telemetry once per call; gives its erasure gauges: the count, and
    whether the oldest open erasure has an age."""
    admin = runtime.kafka_admin(c.settings)
    telemetry = runtime.cluster_telemetry(c, admin, ClusterJobs(c.pool, c.clock))

    def measure() -> tuple[float | None, bool]:
        telemetry.measure()
        age = c.registry.get_sample_value("memoryd_erasure_oldest_open_seconds")
        return c.registry.get_sample_value("memoryd_erasures_open"), age is not None and age > 0

    try:
        yield measure
    finally:
        admin.close()


def test_a_fact_id_the_memory_does_not_hold_erases_nothing_anywhere(
    deployment: Deployment,
) -> None:
    seed(deployment)
    with eraser(deployment) as (c, erase):
        (twin_fact,) = fact_ids(c, TWIN)
        mira_facts = fact_ids(c, MIRA)
        for stranger in (twin_fact, uuid.uuid4()):
            with pytest.raises(UnknownFact, match=str(stranger)):
                erase.erase_fact(MIRA, stranger, REQUEST)
        # org-b's fact keeps its row and its vector; org-a's memory is whole; nothing audited.
        assert fact_ids(c, TWIN) == [twin_fact]
        assert list(c.index.embeddings([twin_fact])) == [twin_fact]
        assert fact_ids(c, MIRA) == mira_facts
        assert audit(deployment.dsn) == []
        # The owner's own erasure of it goes through.
        receipt = erase.erase_fact(TWIN, twin_fact, REQUEST)
        assert receipt.removed["postgres"]["memory_facts"] == 1
        assert receipt.removed["chroma"] == {"vectors": 1}
        assert c.index.embeddings([twin_fact]) == {}


def test_memoryd_forget_refuses_a_fact_the_memory_does_not_hold(
    deployment: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    seed(deployment)
    (twin_fact,) = deployment.with_core(lambda c: fact_ids(c, TWIN))
    argv = ["forget", "--org", "org-a", "mira", "--fact", str(twin_fact), "--reason", "asked"]
    args = build_parser().parse_args(argv)
    assert args.fn(deployment.settings, args) == 1
    assert capsys.readouterr().err == (
        f"memoryd forget: org-a/mira has no fact {twin_fact}; nothing erased\n"
    )
    assert deployment.with_core(lambda c: list(c.index.embeddings([twin_fact]))) == [twin_fact]
    assert audit(deployment.dsn) == []


def erasures_open(deployment: Deployment, capsys: pytest.CaptureFixture[str]) -> Any:
    args = build_parser().parse_args(["erasures", "--open"])
    assert args.fn(deployment.settings, args) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("request_id", [None, "retry-7"])
def test_an_erasure_left_midway_is_finished_by_its_retry(
    deployment: Deployment,
    stoppable_chroma: DisposableChroma,
    capsys: pytest.CaptureFixture[str],
    request_id: str | None,
) -> None:
    deployment = on_chroma_server(deployment, stoppable_chroma.url)
    seed(deployment)
    request = ErasureRequest("test", "asked by the user", request_id)
    with eraser(deployment) as (c, erase), erasure_gauges(c) as open_erasures:
        quokka = next(f for f in c.memory.facts(MIRA) if "quokka" in f.content).fact_id
        with pytest.raises(VectorIndexUnavailable):
            erased_as_chroma_stops(
                lambda: erase.erase_fact(MIRA, quokka, request),
                deployment.dsn,
                MIRA,
                stoppable_chroma,
            )
        assert audit(deployment.dsn) == ["postgres_erased"]
        assert open_erasures() == (1.0, True)  # what MemorydErasureStuck watches
        (left,) = erasures_open(deployment, capsys)  # what its runbook lists, Chroma away
        assert (left["scope"], left["status"], left["fact_id"]) == (
            "fact",
            "postgres_erased",
            str(quokka),
        )
        assert (left["organization_id"], left["user_id"]) == ("org-a", "mira")
        assert quokka not in fact_ids(c, MIRA)  # its row went, its vector is left
        stoppable_chroma.start()
        assert list(c.index.embeddings([quokka])) == [quokka]

        receipt = erase.erase_fact(MIRA, quokka, request)
        assert audit(deployment.dsn) == ["completed"]
        assert receipt.removed["postgres"]["memory_facts"] == 1
        assert receipt.removed["chroma"] == {"vectors": 1}
        assert c.index.embeddings([quokka]) == {}
        assert open_erasures() == (0.0, False)
        assert erasures_open(deployment, capsys) == []
        # Asked once more, with the request id or without: the erasure that removed it.
        assert erase.erase_fact(MIRA, quokka, request) == receipt
        assert audit(deployment.dsn) == ["completed"]


def test_an_open_erasure_naming_another_memorys_fact_completes_erasing_nothing(
    deployment: Deployment,
) -> None:
    """Erasures opened before the owner was checked may name another memory's fact; resumed,
    they must leave it whole."""
    seed(deployment)
    with eraser(deployment) as (c, erase):
        (twin_fact,) = fact_ids(c, TWIN)
        c.erasures.start(
            uuid.uuid4(),
            subject=c.subjects(MIRA),
            scope=ErasureScope.FACT,
            key=MIRA,
            fact_id=twin_fact,
            actor="test",
            reason="opened by an older version",
        )
        (receipt,) = erase.resume_pending()
        assert receipt.removed["postgres"] == {}
        assert receipt.removed["chroma"] == {"vectors": 0}
        assert audit(deployment.dsn) == ["completed"]
        assert fact_ids(c, TWIN) == [twin_fact]
        assert list(c.index.embeddings([twin_fact])) == [twin_fact]


def test_a_fact_written_over_still_redacts_the_observations_of_its_earlier_versions(
    deployment: Deployment,
) -> None:
    """A run that re-adds a fact it was not shown (contradicted, say) writes its row over with
    only the new sources, in a wording that may differ in case: the first observation is
    still the fact's and loses its text with it."""
    first = make_event("mira", "My sister Ingrid moved to Oslo last spring", org="org-a")
    again = make_event("mira", "my sister ingrid moved to oslo last spring", minutes=5)
    deployment.publish([first])
    deployment.run_both()
    deployment.publish([again])
    deployment.run_both()
    with eraser(deployment) as (c, erase):
        (fact,) = c.memory.facts(MIRA)
        assert first.event_id in fact.provenance.source_event_ids
        # What the upsert leaves when the re-adding run did not have the fact among its own.
        deployment.query(
            "UPDATE memory_facts SET content = %s, source_event_ids = %s WHERE fact_id = %s"
            " RETURNING fact_id",
            (again.content, [again.event_id], fact.fact_id),
        )
        erase.erase_fact(MIRA, fact.fact_id, REQUEST)
    contents = dict(
        deployment.query("SELECT event_id, content FROM context_events WHERE user_id = 'mira'")
    )
    assert contents == {first.event_id: "[erased]", again.event_id: "[erased]"}


def test_an_observation_logged_after_its_fact_was_erased_is_logged_redacted(
    deployment: Deployment,
) -> None:
    # The processor consolidates from Kafka and may be ahead of the log writer: the fact is
    # erased before the event it came from is logged, and erase_fact found no row to redact.
    quokka = make_event("mira", "I keep a pet quokka named Bramble", org="org-a")
    twin = quokka.model_copy(update={"organization_id": "org-b"})  # its id, another memory
    deployment.publish([quokka, twin])
    deployment.run_processor()
    assert deployment.query("SELECT count(*) FROM context_events") == [(0,)]
    with eraser(deployment) as (c, erase):
        (fact,) = c.memory.facts(MIRA)
        erase.erase_fact(MIRA, fact.fact_id, REQUEST)
    deployment.run_log_writer()
    contents = deployment.query(
        "SELECT organization_id, content FROM context_events ORDER BY organization_id"
    )
    assert contents == [("org-a", "[erased]"), ("org-b", quokka.content)]
    assert "Bramble" not in str(deployment.query("SELECT * FROM redacted_events"))


def test_an_observation_waiting_in_kafka_when_its_text_was_erased_does_not_make_the_fact_again(
    deployment: Deployment,
) -> None:
    # Said, then learned again in the fact's own words: the second was logged, and the
    # processor had not got to it (lagging, or a dead letter redriven later) when the fact
    # was erased; its logged copy lost the text, the one in Kafka did not.
    first = make_event("mira", "I keep a pet quokka named Bramble", minutes=0, org="org-a")
    deployment.publish([first])
    deployment.run_both()
    with eraser(deployment) as (c, erase):
        (fact,) = c.memory.facts(MIRA)
        again = make_event(
            "mira", fact.content, EventType.LEARNED_FACT, source=Source.AUTONOMOUS, minutes=5,
            org="org-a",
        )  # fmt: skip
        deployment.publish([again])
        deployment.run_log_writer()
        erase.erase_fact(MIRA, fact.fact_id, REQUEST)
    assert deployment.query(
        "SELECT content FROM context_events WHERE event_id = %s", (again.event_id,)
    ) == [("[erased]",)]
    deployment.run_processor()
    assert deployment.query("SELECT content FROM memory_facts WHERE user_id = 'mira'") == []
    assert deployment.query(
        "SELECT count(*) FROM consolidated_events WHERE event_id = %s", (again.event_id,)
    ) == [(0,)]
    # Not consolidated, not a letter, and accounted for: erased.
    report = check_deployment(deployment.settings, {MIRA: [first.event_id, again.event_id]})
    assert report.unaccounted == 0, report.summary()


def test_a_fact_that_quotes_the_erased_one_loses_the_quote_and_the_fold_still_holds(
    deployment: Deployment,
) -> None:
    quokka = make_fact("mira", "Bramble is a quokka", org="org-a")
    quoting = make_fact("mira", "Mira said Bramble is a quokka at the zoo", org="org-a")
    other = make_fact("mira", "Mira plays the cello", org="org-a")
    with eraser(deployment) as (c, erase):
        # A run that records its effect, as the processor's do: the fold has it to replay.
        update = seed_update(c.memory, "mira", [quokka, quoting, other], org="org-a")
        effect = applied_effect(update.state, update.fact_changes, {})
        update = replace(update, run=replace(update.run, output={"applied": effect}))
        c.memory.apply(update)
        wiring.indexer(c).index_changes(update)
        erase.erase_fact(MIRA, quokka.fact_id, REQUEST)
        contents = {f.fact_id: f.content for f in c.memory.facts(MIRA)}
        assert contents == {
            quoting.fact_id: "Mira said [erased] at the zoo",
            other.fact_id: "Mira plays the cello",
        }
        (pending,) = c.memory.pending_index()  # its vector goes back to the index queue
        assert pending.fact_id == quoting.fact_id
        wiring.indexer(c).drain_pending()
        assert "Bramble" not in str(c.index.stored([quoting.fact_id]))
        run_log = PostgresRunLog(c.pool)
        assert verify_memory(MIRA, run_log.runs(MIRA), live_memory(c, run_log, MIRA)).ok
    history = deployment.query("SELECT before, after FROM fact_history")
    assert history
    assert "Bramble" not in str(history)


def test_the_read_audit_loses_an_erased_fact_and_the_queries_quoting_it(
    deployment: Deployment,
) -> None:
    seed(deployment)
    with eraser(deployment) as (c, erase):
        reads = PostgresReadModel(c.pool, c.subjects)
        service = ContextService(
            reads, c.index, c.clock, audit=BatchWriter("context-log", reads.write_context_logs)
        )
        (quokka,) = [f for f in c.memory.facts(MIRA) if "quokka" in f.content]
        quote = f"Is it true? {quokka.content}"
        bundle = service.assemble(MIRA, quote)
        service.close()
        assert quokka.fact_id in {r.fact.fact_id for r in bundle.facts}
        erase.erase_fact(MIRA, quokka.fact_id, REQUEST)
    (query, retrieved) = deployment.query("SELECT query, retrieved::text FROM context_logs")[0]
    assert query == quote.replace(quokka.content, "[erased]")
    assert str(quokka.fact_id) not in retrieved
    assert '"fact_id": "[erased]"' in retrieved


def test_a_forget_whose_partition_ends_cannot_be_read_is_a_publish_error_left_open(
    deployment: Deployment,
) -> None:
    seed(deployment)
    # The real reader, whose broker cannot say: it has no partitions of the topic asked about.
    k = deployment.settings.kafka
    unreadable = partial(end_offsets, k.bootstrap_servers, f"{k.topic}-gone")

    with eraser(deployment) as (c, erase):
        with pytest.raises(
            PublishError, match=r"partition ends not read: topic \S+-gone has no partitions"
        ):
            replace(erase, end_offsets=unreadable).forget(MIRA, REQUEST)
        assert audit(deployment.dsn) == ["started"]  # open: asked again, it goes on
        assert fact_ids(c, MIRA)
        receipt = erase.forget(MIRA, REQUEST)
    assert audit(deployment.dsn) == ["completed"]
    assert receipt.removed["postgres"]["memory_facts"] == 2


def test_an_erasure_that_fails_to_resume_does_not_hold_back_the_ones_after_it(
    deployment: Deployment,
) -> None:
    """The processors' resumption finishes every open erasure it can: the API's accepted ones
    complete through it, and one whose step fails each time must not stop them all. The CLI's
    `forget --resume` stops at the failure and says why."""
    seed(deployment)
    with eraser(deployment) as (c, erase):
        for key in (MIRA, TWIN):  # Mira's first: the pass meets it first
            c.erasures.start(
                uuid.uuid4(),
                subject=c.subjects(key),
                scope=ErasureScope.MEMORY,
                key=key,
                fact_id=None,
                actor="test",
                reason="accepted while its memory was busy",
            )
        stuck = replace(erase, index=cast(VectorIndex, LeavesVectorsOf(c.index, MIRA)))
        with pytest.raises(ErasureIncomplete):
            stuck.resume_pending()  # as `forget --resume` calls it

        (receipt,) = stuck.resume_pending(keep_going=True)  # as the scheduler's job does
        assert receipt.subject == c.subjects(TWIN)
        assert fact_ids(c, TWIN) == []
        assert sorted(audit(deployment.dsn)) == ["completed", "postgres_erased"]
        (later,) = erase.resume_pending(keep_going=True)  # taken up again, and finished
        assert later.subject == c.subjects(MIRA)
        assert audit(deployment.dsn) == ["completed", "completed"]


class LeavesVectorsOf:
    """The vector index, whose deletes of one memory's vectors do nothing."""

    def __init__(self, index: VectorIndex, key: MemoryKey) -> None:
        self._index, self._key = index, key

    def __getattr__(self, name: str) -> Any:
        return getattr(self._index, name)

    def delete_memory(self, key: MemoryKey) -> None:
        if key != self._key:
            self._index.delete_memory(key)
