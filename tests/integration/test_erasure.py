"""Forgetting a memory on real Kafka, Postgres and Chroma: nothing of it left anywhere.

org-a's "mira" is forgotten while org-b has a "mira" of its own (same user id, overlapping
fact texts) and org-a has another user. After the forget, a scan of every textual column of
every table, of Chroma, of a processor's buffers and of the read path's caches finds none of
the forgotten memory's distinctive strings; replaying the topic from offset 0 through new
consumer groups brings nothing back; the other memories are exactly as they were.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
from chromadb.api import ClientAPI

from consumers.processor import MemoryProcessor
from consumers.settings import ProcessorSettings
from domain.ids import MemoryKey
from memoryd import wiring
from memoryd.analyst.export import export_document
from memoryd.erasure import ErasureRequest
from memoryd.settings import KafkaSettings, Settings
from producers.contract import ContextEvent, EventType, Source
from store.chroma import close_client, embedded_client
from store.read.background import BatchWriter
from store.read.context_service import ContextService
from store.read.fact_queries import PostgresReadModel
from store.read.injection import InjectionCache
from store.write.run_log import PostgresRunLog
from tests.support.builders import key_of, make_event
from tests.support.deployment import Deployment, wait_until
from tests.support.erasure import (
    find_in_chroma,
    find_in_tables,
    memory_row_counts,
    rows,
)

pytestmark = pytest.mark.integration

FORGOTTEN = key_of("mira", "org-a")
SAME_ID_ELSEWHERE = key_of("mira", "org-b")
NEIGHBOUR = key_of("noor", "org-a")
OTHERS = (SAME_ID_ELSEWHERE, NEIGHBOUR)
# Words only the forgotten memory ever had (the shared ones cannot prove anything).
DISTINCT = ["quokka", "marmalade-zq19", "vestibule ltd", "zq-invoice-5521", "tromsø", "bramble"]
EXPORTED_AT = datetime(2026, 12, 1, tzinfo=UTC)


def forgotten_events() -> list[ContextEvent]:
    return [
        make_event(
            "mira",
            "I keep a pet quokka named Bramble",
            minutes=0,
        ),
        make_event(
            "mira",
            "I like marmalade-zq19 on toast",
            EventType.PREFERENCE,
            minutes=1,
        ),
        make_event(
            "mira",
            "Project Vestibule Ltd migration ships in May",
            EventType.PROJECT_DETAILS,
            minutes=2,
        ),
        make_event(
            "mira",
            '"Vestibule Ltd"',
            EventType.SCAFFOLD_UPDATE,
            minutes=3,
            source=Source.AUTONOMOUS,
            scaffold_key="Employer",
        ),
        make_event(
            "mira",
            "She used to be a lighthouse keeper in Tromsø",
            EventType.LEARNED_FACT,
            minutes=4,
            source=Source.AUTONOMOUS,
        ),
        make_event(
            "mira",
            "Invoice from Vestibule Ltd: 900 EUR",
            EventType.TOOL_OUTPUT,
            minutes=5,
            source=Source.TOOL,
            tool_id="pdf-reader",
            attachment_id="att-zq",
            filename="zq-invoice-5521.pdf",
        ),
        make_event(
            "mira",
            "Mail from Vestibule Ltd arrives on Mondays",
            EventType.CONNECTION_UPDATE,
            minutes=6,
            connection_id="gmail-zq",
        ),
        make_event(
            "mira",
            "I live in Lisbon",
            minutes=7,
        ),
    ]


def other_events() -> list[ContextEvent]:
    return [
        make_event("mira", "I live in Lisbon", minutes=0, org="org-b"),
        make_event("mira", "I play the cello", minutes=1, org="org-b"),
        make_event("noor", "I live in Lisbon", minutes=0, org="org-a"),
        make_event("noor", "I prefer short answers", EventType.PREFERENCE, minutes=1),
    ]


def snapshot(c: wiring.Core, key: MemoryKey) -> dict[str, Any]:
    """Everything memoryd holds of a memory: its export, and its vectors."""
    doc = export_document(c, PostgresRunLog(c.pool), key, EXPORTED_AT)
    with chroma(c.settings) as client:
        got = client.get_collection(c.settings.chroma.collection).get(
            where={"$and": [{"organization_id": key.organization_id}, {"user_id": key.user_id}]},
            include=["documents", "metadatas"],
        )
    vectors = sorted(zip(got["ids"], got["documents"] or [], strict=True))
    return {"export": doc, "vectors": vectors}


@contextmanager
def chroma(settings: Settings) -> Iterator[ClientAPI]:
    client = embedded_client(settings.chroma.path)
    try:
        yield client
    finally:
        close_client(client)


def with_groups(settings: Settings, suffix: str, **tuning: Any) -> Settings:
    """The same deployment read by new consumer groups (from offset 0), with other tuning."""
    kafka: KafkaSettings = settings.kafka.model_copy(
        update={
            "log_writer_group": f"{settings.kafka.log_writer_group}-{suffix}",
            "processor_group": f"{settings.kafka.processor_group}-{suffix}",
        }
    )
    processor: ProcessorSettings = settings.processor.model_copy(update=tuning)
    return settings.model_copy(update={"kafka": kafka, "processor": processor})


@contextmanager
def holding_processor(settings: Settings) -> Iterator[tuple[MemoryProcessor, wiring.Core]]:
    """A processor that buffers and does not flush on its own (huge batch and wait)."""
    with wiring.core(settings) as c:
        processor = wiring.processor(c)
        processor.start()
        try:
            yield processor, c
        finally:
            processor.shutdown()


def leftovers(held: list[ContextEvent]) -> list[str]:
    return [e.content for e in held if (e.organization_id, e.user_id) == ("org-a", "mira")]


def extra_events() -> list[ContextEvent]:
    """Published before the forget, held in a processor's buffers when it happens."""
    return [
        make_event("mira", "My quokka Bramble learned a trick", minutes=20, org="org-a"),
        make_event("mira", "I ordered more marmalade-zq19", minutes=21, org="org-a"),
    ]


def forgotten_metric(c: wiring.Core, consumer: str) -> float:
    value = c.registry.get_sample_value("memoryd_events_forgotten_total", {"consumer": consumer})
    return value or 0.0


def erasure_tables_name(dsn: str, needle: str) -> list[str]:
    """Which of the erasure's own tables hold `needle` anywhere in a row."""
    found = []
    for table in ("erasure_audit", "erasure_pending", "memory_cutoffs"):
        query = f"SELECT count(*) FROM {table} t WHERE strpos(t::text, %s) > 0"
        if rows(dsn, query, (needle,)) != [(0,)]:
            found.append(table)
    return found


def test_forget_leaves_nothing_of_the_memory_and_nothing_else_changes(
    deployment: Deployment,
) -> None:
    dsn = deployment.dsn
    deployment.publish(forgotten_events() + other_events())
    deployment.run_both()
    tuning = {"max_batch": 1_000, "max_wait_s": 600.0}
    holding = deployment.settings.model_copy(
        update={"processor": deployment.settings.processor.model_copy(update=tuning)}
    )
    late_rows: list[Any] = []
    with wiring.core(deployment.settings) as c:
        wiring.indexer(c).drain_pending()
        c.memory.set_credit(FORGOTTEN, 5_000_000)
        before = {key: snapshot(c, key) for key in OTHERS}
        reads = PostgresReadModel(c.pool, c.subjects)
        local, replica = InjectionCache(reads), InjectionCache(reads)
        # Two read paths (two API replicas) cached the memory; the replica's audit row is
        # written before the forget, the local one's is still queued when it happens.
        replica_service = ContextService(
            reads,
            c.index,
            c.clock,
            cache=replica,
            audit=BatchWriter("context-log", reads.write_context_logs),
        )
        local_service = ContextService(
            reads, c.index, c.clock, cache=local, audit=BatchWriter("late", late_rows.extend)
        )
        for read_path in (replica_service, local_service):
            bundle = read_path.assemble(FORGOTTEN, "Tell me about the quokka and Vestibule Ltd")
            assert "quokka" in bundle.prompt_block.lower()
        replica_service.close()
        local_service.close()
        expected = memory_row_counts(dsn, FORGOTTEN)
        assert expected["context_logs"] == 1
        assert expected["credit_ledger"] > 0
        vectors = c.index.count(FORGOTTEN)
        assert vectors > 0

        deployment.publish(extra_events())
        with holding_processor(holding) as (processor, pc):

            def holds_both() -> bool:
                processor.step()
                return len(leftovers(processor.held_events())) == 2

            wait_until(holds_both, 60, "the processor to buffer the memory's events")
            pub = wiring.publisher(deployment.settings)
            try:
                request = ErasureRequest("dpo@example.com", "GDPR art. 17", "ticket-17")
                receipt = wiring.eraser(c, pub, on_erased=local_service.forget).forget(
                    FORGOTTEN, request
                )
            finally:
                pub.close()

            def dropped() -> bool:
                processor.step()
                return leftovers(processor.held_events()) == []

            wait_until(dropped, 60, "the processor to meet the tombstone")
            assert forgotten_metric(pc, "processor") == 2

        # What the receipt says was removed is what was there, table by table.
        removed = receipt.removed
        assert removed["postgres"] == {
            t: n for t, n in expected.items() if t not in ("credit_ledger", "erasure_pending")
        }
        assert removed["anonymised"] == {"credit_ledger": expected["credit_ledger"]}
        assert removed["chroma"] == {"vectors": vectors}
        pseudonymous = rows(
            dsn,
            "SELECT count(*) FROM credit_ledger WHERE user_id = %s",
            (f"erased:{receipt.erasure_id}",),
        )
        assert pseudonymous == [(expected["credit_ledger"],)]
        # The read paths: this process's cache was told; the replica's sweep finds out.
        assert FORGOTTEN not in local.memories()
        assert replica.sweep() == 1
        assert FORGOTTEN not in replica.memories()
        # A turn read before the forget, audited after it: its row is not written.
        assert late_rows, "the local read path's audit row was held back"
        reads.write_context_logs(late_rows)
        assert memory_row_counts(dsn, FORGOTTEN)["context_logs"] == 0

        after_forget = wiring.publisher(deployment.settings)
        fresh = make_event("mira", "I now collect stamps", minutes=30, org="org-a")
        try:
            after_forget.publish([fresh])
        finally:
            after_forget.close()
    deployment.run_both()

    def nothing_left() -> None:
        assert find_in_tables(dsn, DISTINCT) == {}
        with chroma(deployment.settings) as client:
            assert find_in_chroma(client, DISTINCT) == {}
        # The erasure's own records hold neither the user id nor the organization's.
        assert erasure_tables_name(dsn, "mira") == []
        assert rows(dsn, "SELECT count(*) FROM erasure_pending") == [(0,)]
        # The memory starts afresh after the forget, from the events after its tombstone.
        logged = rows(
            dsn,
            "SELECT event_id, kafka_partition FROM context_events"
            " WHERE organization_id = 'org-a' AND user_id = 'mira'",
        )
        assert logged == [(fresh.event_id, receipt.tombstone.partition)]  # type: ignore[union-attr]

    nothing_left()
    # Replay the whole topic through new consumer groups: nothing comes back.
    replay = with_groups(deployment.settings, "replay")
    with wiring.core(replay) as rc:
        wiring.log_writer(rc).drain()
        wiring.processor(rc).run_until_idle()
        pre_tombstone = len(forgotten_events()) + len(extra_events())
        assert forgotten_metric(rc, "log-writer") == pre_tombstone
        assert forgotten_metric(rc, "processor") == pre_tombstone
    nothing_left()
    with wiring.core(deployment.settings) as c:
        assert {key: snapshot(c, key) for key in OTHERS} == before
        state = c.memory.load_state(FORGOTTEN)
        assert state.version == 1
        assert [f.provenance.source_event_ids for f in c.memory.facts(FORGOTTEN)] == [
            (fresh.event_id,)
        ]
        # Asked again with the same request id: the same receipt, and nothing erased anew.
        pub = wiring.publisher(deployment.settings)
        try:
            again = wiring.eraser(c, pub).forget(FORGOTTEN, request)
        finally:
            pub.close()
        assert again == receipt
        assert c.memory.load_state(FORGOTTEN).version == 1
