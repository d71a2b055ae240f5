"""The walking skeleton on real Kafka, Postgres and Chroma: events in, memory out."""

from __future__ import annotations

import json

import psycopg
import pytest

from consumers.dead_letter import HEADER_REASON, HEADER_STAGE
from memoryd import wiring
from memoryd.settings import ChromaSettings
from producers.contract import EventType, Source
from tests.support.builders import key_of, make_event
from tests.support.deployment import Deployment, dead_letters, letter_count

pytestmark = pytest.mark.integration


def test_observations_become_working_memory_scaffold_and_facts(deployment: Deployment) -> None:
    events = [
        make_event("ada", "I work in engineering at Initech", minutes=0),
        make_event(
            "ada", "I prefer short answers with code examples", EventType.PREFERENCE, minutes=1
        ),
        make_event(
            "ada",
            "Project Falcon ships the billing API by December 15",
            EventType.PROJECT_DETAILS,
            minutes=2,
        ),
        make_event("ada", "Actually I moved to design last month", EventType.CORRECTION, minutes=3),
        make_event(
            "ada",
            '"Product designer"',
            EventType.SCAFFOLD_UPDATE,
            minutes=4,
            source=Source.AUTONOMOUS,
            scaffold_key="Title",
        ),
        make_event(
            "ada",
            "Her manager is Grace Hopper",
            EventType.LEARNED_FACT,
            minutes=5,
            source=Source.AUTONOMOUS,
        ),
        make_event(
            "ada",
            "The quarterly review with Acme is on Friday",
            minutes=6,
            connection_id="gmail-work",
        ),
        make_event(
            "ada",
            "Invoice 4411 from Acme totals 12,400 EUR and is due on 30 November.",
            EventType.TOOL_OUTPUT,
            minutes=7,
            source=Source.TOOL,
            tool_id="pdf-reader",
            attachment_id="att-1",
            filename="invoice-4411.pdf",
        ),
        make_event("bob", "I live in Lisbon", minutes=0, org="org-b"),
        make_event("cy", "I am training for the Berlin marathon", minutes=0),
    ]
    deployment.publish(events)
    deployment.run_both()

    logged = {r[0] for r in deployment.query("SELECT event_id FROM context_events")}
    consumed = {r[0] for r in deployment.query("SELECT event_id FROM consolidated_events")}
    assert logged == consumed == {e.event_id for e in events}

    def check(c: wiring.Core) -> None:
        ada = c.memory.load_state(key_of("ada"))
        assert ada.version >= 1
        assert ada.working_memory
        assert ada.scaffold["Title"] == "Product designer"
        assert "Her manager is Grace Hopper" in ada.learned_info
        contents = [f.content.lower() for f in c.memory.facts(key_of("ada"))]
        assert not any("engineering" in x for x in contents), contents
        assert any("design" in x for x in contents), contents

        service = wiring.context_service(c)
        general = service.assemble(key_of("ada"), "When is the Acme review?")
        with_mail = service.assemble(key_of("ada"), "When is the Acme review?", ["gmail-work"])
        assert not any("quarterly review" in r.fact.content for r in general.facts)
        # Nothing learned inside the mail connection reaches a turn where it is not active.
        assert "quarterly review" not in general.prompt_block
        assert "gmail-work" in with_mail.scaffold.get("Connections", {})
        assert any("quarterly review" in r.fact.content for r in with_mail.facts)
        assert "# Your Context" in with_mail.prompt_block
        assert "Relevant Retrieved Facts:" in with_mail.prompt_block
        attachment = service.assemble(key_of("ada"), "How much is the Acme invoice?")
        assert any(r.fact.provenance.attachment_id == "att-1" for r in attachment.facts)
        assert c.memory.load_state(key_of("bob", "org-b")).version >= 1
        assert c.memory.load_state(key_of("bob")).version == 0  # org-a has no bob

    deployment.with_core(check)


def test_a_scaffold_value_jsonb_refuses_is_stored_replaced_not_failing_its_batch(
    deployment: Deployment,
) -> None:
    # The top-level value is a string with no NUL, so the producer takes it; the consolidator
    # decodes the object it holds, with a NUL and a lone surrogate jsonb cannot store.
    inner = json.dumps({"Pet": "Rex\x00", "Nick": "\ud800"})
    events = [
        make_event("ada", "I work in engineering at Initech", minutes=0),
        make_event(
            "ada",
            json.dumps(inner),
            EventType.SCAFFOLD_UPDATE,
            minutes=1,
            source=Source.AUTONOMOUS,
            scaffold_key="Profile",
        ),
    ]
    deployment.publish(events)
    deployment.run_both()

    consumed = {r[0] for r in deployment.query("SELECT event_id FROM consolidated_events")}
    assert consumed == {e.event_id for e in events}
    statuses = deployment.query("SELECT DISTINCT status FROM consolidation_runs")
    assert statuses == [("succeeded",)]

    def check(c: wiring.Core) -> None:
        ada = c.memory.load_state(key_of("ada"))
        assert ada.scaffold["Profile"] == {"Pet": "Rex\ufffd", "Nick": "\ufffd"}

    deployment.with_core(check)


def test_event_log_rejects_update_and_delete(deployment: Deployment) -> None:
    deployment.publish([make_event("ada", "I work in engineering")])
    assert deployment.run_log_writer() == 1
    with psycopg.connect(deployment.dsn) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
            conn.execute("UPDATE context_events SET content = 'forged'")
        conn.rollback()
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
            conn.execute("DELETE FROM context_events")
        conn.rollback()
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
            conn.execute("TRUNCATE context_events")
        conn.rollback()
    assert deployment.query("SELECT count(*) FROM context_events") == [(1,)]
    # The one way out is the erase path, and only for an erasure audited beforehand.
    with psycopg.connect(deployment.dsn) as conn:
        with pytest.raises(psycopg.errors.RaiseException, match="audited before it runs"):
            conn.execute(
                "SELECT erase_memory(gen_random_uuid(), 'org-a', 'ada', 's', 'p', 1, '{}')"
            )
        conn.rollback()
    assert deployment.query("SELECT count(*) FROM context_events") == [(1,)]


def test_bad_records_are_dead_lettered_and_consumers_keep_going(deployment: Deployment) -> None:
    deployment.produce_raw(
        [b"this is not json", b'{"event_id": "nope", "user_id": "ada"}'], key=b"ada"
    )
    good = make_event("ada", "I work in engineering")
    deployment.publish([good])
    deployment.run_both()

    assert deployment.query("SELECT event_id FROM context_events") == [(good.event_id,)]
    assert deployment.query("SELECT event_id FROM consolidated_events") == [(good.event_id,)]
    kafka = deployment.settings.kafka
    letters = dead_letters(kafka.bootstrap_servers, kafka.dead_letter_topic, 4)
    # One letter per bad record and consumer: a letter sent twice is one too many.
    assert len(letters) == letter_count(kafka.bootstrap_servers, kafka.dead_letter_topic) == 4
    by_consumer: dict[str, set[str]] = {}
    for letter in letters:
        headers = dict(letter.headers)
        assert headers[HEADER_REASON]
        by_consumer.setdefault(headers["dlq.consumer"].decode(), set()).add(
            headers[HEADER_STAGE].decode()
        )
    assert by_consumer == {
        "log-writer": {"decode", "validate"},
        "processor": {"decode", "validate"},
    }
    reasons = {dict(x.headers)[HEADER_REASON].decode() for x in letters}
    assert any("not JSON" in r for r in reasons)
    assert any("event_id" in r for r in reasons)


def test_new_user_gets_an_empty_valid_context(deployment: Deployment) -> None:
    bundle = deployment.with_core(
        lambda c: wiring.context_service(c).assemble(key_of("nobody"), "hello")
    )
    assert bundle.working_memory == ""
    assert bundle.scaffold == {}
    assert bundle.facts == ()
    assert not bundle.degraded
    assert bundle.memory_version == 0
    assert "# Your Context" in bundle.prompt_block


def test_context_is_degraded_not_failed_when_chroma_is_down(deployment: Deployment) -> None:
    deployment.publish([make_event("ada", "I work in engineering at Initech")])
    deployment.run_both()
    dead = deployment.settings.model_copy(
        update={"chroma": ChromaSettings(mode="http", url="http://127.0.0.1:9")}
    )
    with wiring.core(dead) as c:
        bundle = wiring.context_service(c).assemble(key_of("ada"), "Where does she work?")
    assert bundle.degraded
    assert bundle.degraded_reason
    assert "unavailable" in bundle.degraded_reason
    assert bundle.working_memory
    assert bundle.memory_version == 1
