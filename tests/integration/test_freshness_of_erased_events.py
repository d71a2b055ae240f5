"""Events whose logged text a fact erasure redacted, on real Kafka and Postgres.

The flush drops such an event as erased: it waits for nothing, so the freshness probe counts
it neither pending nor parked (else the freshness alerts fire and never resolve), and the
processor counts it as forgotten. A producer cannot send that text itself: it would be
dropped the same way, unseen.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager

import pytest

from domain.erasure import REDACTED_JSON, REDACTION
from domain.ids import MemoryKey
from memoryd import wiring
from memoryd.erasure import Eraser, ErasureRequest
from memoryd.redrive import RedriveSummary, redrive
from processors.schema import ConsolidationRequest
from producers.contract import EventType, Source
from store.write.freshness import Freshness, FreshnessProbe
from tests.support.builders import key_of, make_event
from tests.support.deployment import Deployment, dead_letters, headers_of, topic_size
from tests.support.fakes import FlakyBackend

pytestmark = pytest.mark.integration

MIRA = key_of("mira", "org-a")
REQUEST = ErasureRequest("test", "asked by the user")
FORGOTTEN: tuple[str, dict[str, str]] = (
    "memoryd_events_forgotten_total",
    {"consumer": "processor"},
)


class Chokes(FlakyBackend):
    """The offline backend with a bug: every run fails, and its events are parked."""

    def before(self, request: ConsolidationRequest) -> None:
        raise TypeError("unsupported operand type(s) for +: 'int' and 'str'")


@contextmanager
def eraser(deployment: Deployment) -> Iterator[Eraser]:
    with wiring.core(deployment.settings) as c, closing(wiring.publisher(c.settings)) as pub:
        yield wiring.eraser(c, pub)


def measured(deployment: Deployment) -> tuple[int, int, bool]:
    """(pending, parked, whether something is old) by a probe of its own, from the log's start."""
    f: Freshness = deployment.with_core(lambda c: FreshnessProbe(c.pool).measure())
    return f.pending, f.parked, f.oldest_pending_age_s > 0


def learned_again(deployment: Deployment, key: MemoryKey) -> tuple[uuid.UUID, uuid.UUID]:
    """A fact consolidated from a first event, and a second event in the fact's own words,
    logged and not consolidated yet: the erasure of the fact redacts both in the log."""
    first = make_event("mira", "I keep a pet quokka named Bramble", minutes=0, org="org-a")
    deployment.publish([first])
    deployment.run_both()
    (fact,) = deployment.with_core(lambda c: c.memory.facts(key))
    again = make_event(
        "mira", fact.content, EventType.LEARNED_FACT, source=Source.AUTONOMOUS, minutes=5,
        org="org-a",
    )  # fmt: skip
    deployment.publish([again])
    deployment.run_log_writer()
    return fact.fact_id, again.event_id


def test_a_pending_event_an_erasure_redacts_settles_and_is_counted_forgotten(
    deployment: Deployment,
) -> None:
    fact_id, again = learned_again(deployment, MIRA)
    assert measured(deployment)[:2] == (1, 0)
    with eraser(deployment) as erase:
        erase.erase_fact(MIRA, fact_id, REQUEST)
    assert deployment.query("SELECT content FROM context_events WHERE event_id = %s", (again,)) == [
        (REDACTION,)
    ]
    # Nothing will consolidate it: it no longer waits, and freshness is that of nothing.
    assert measured(deployment) == (0, 0, False)

    def run(c: wiring.Core) -> float | None:
        wiring.processor(c).run_until_idle(idle_s=2.0)
        return c.registry.get_sample_value(*FORGOTTEN)

    assert deployment.with_core(run) == 1  # the flush dropped it, and says so
    assert deployment.query(
        "SELECT count(*) FROM consolidated_events WHERE event_id = %s", (again,)
    ) == [(0,)]
    assert measured(deployment) == (0, 0, False)


def test_a_parked_event_an_erasure_redacts_is_parked_no_more(deployment: Deployment) -> None:
    fact_id, again = learned_again(deployment, MIRA)
    deployment.run_processor(Chokes())
    k = deployment.settings.kafka
    dead_letters(k.bootstrap_servers, k.dead_letter_topic, expected=1)
    assert measured(deployment) == (0, 1, False)
    with eraser(deployment) as erase:
        erase.erase_fact(MIRA, fact_id, REQUEST)
    # Redriven, the flush would drop it: it waits for no operator, and a redrive settles it
    # without putting the erased text back on the event topic.
    assert measured(deployment) == (0, 0, False)
    published = topic_size(k.bootstrap_servers, k.topic)
    assert redrive(deployment.settings, idle_s=1.0) == RedriveSummary(settled_by_erasure=1)
    assert topic_size(k.bootstrap_servers, k.topic) == published
    deployment.run_processor()
    assert deployment.query(
        "SELECT count(*) FROM consolidated_events WHERE event_id = %s", (again,)
    ) == [(0,)]
    assert measured(deployment) == (0, 0, False)


def test_an_event_of_an_erasures_text_is_a_validate_dead_letter_not_a_silent_drop(
    deployment: Deployment,
) -> None:
    # Made as a producer that skips the contract would send them.
    marked = [
        make_event("ada", "I work in engineering", minutes=0).model_copy(
            update={"content": REDACTION}
        ),
        make_event(
            "ada", '"x"', EventType.SCAFFOLD_UPDATE, minutes=1, scaffold_key="Role"
        ).model_copy(update={"content": REDACTED_JSON}),
    ]
    fine = make_event("bo", "I live in Lisbon", minutes=0)
    deployment.publish([*marked, fine])
    deployment.run_both()
    logged = {r[0] for r in deployment.query("SELECT event_id FROM context_events")}
    assert logged == {fine.event_id}
    k = deployment.settings.kafka
    letters = dead_letters(k.bootstrap_servers, k.dead_letter_topic, expected=4)
    assert sorted(headers_of(x)["dlq.consumer"] for x in letters) == 2 * ["log-writer"] + 2 * [
        "processor"
    ]
    assert {headers_of(x)["dlq.stage"] for x in letters} == {"validate"}
    assert all("reserved by memoryd" in headers_of(x)["dlq.reason"] for x in letters)
