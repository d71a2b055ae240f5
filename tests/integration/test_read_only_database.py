"""A database that refuses writes because it is read-only (a failover to a demoted node, a
pooler routing to a replica) is an outage: the processor waits it out and keeps its batch, as
through Postgres being away, rather than dead-lettering it as a batch that cannot succeed. So
is a privilege revoked by mistake; and neither has the backend asked again on every retry."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from domain.model import TokenUsage
from memoryd import wiring
from processors.schema import BackendResponse, ConsolidationRequest
from store.errors import DatabaseUnavailable
from tests.support.builders import key_of, make_event
from tests.support.deployment import Deployment, letter_count, tuned, wait_until
from tests.support.fakes import FlakyBackend

pytestmark = pytest.mark.integration
USAGE = TokenUsage(prompt_tokens=300, completion_tokens=40)


def read_only(dsn: str, *, on: bool) -> None:
    """Make the test's database read-only for new sessions (or writable again), and end the
    sessions open on it, as a failover does: the pool's next connections meet the new state."""
    setting = (
        "SET default_transaction_read_only = on" if on else "RESET default_transaction_read_only"
    )
    name = sql.Identifier(conninfo_to_dict(dsn)["dbname"])
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET default_transaction_read_only = off")  # an operator's session
        conn.execute(sql.SQL("ALTER DATABASE {} ").format(name) + sql.SQL(setting))
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


def test_a_write_to_a_read_only_database_is_an_outage(deployment: Deployment) -> None:
    read_only(deployment.dsn, on=True)
    with (
        wiring.core(deployment.settings) as c,
        pytest.raises(DatabaseUnavailable, match="read-only transaction") as raised,
    ):
        c.memory.set_credit(key_of("ada"), 100)
    assert isinstance(raised.value.__cause__, psycopg.errors.ReadOnlySqlTransaction)


def test_the_processor_waits_a_read_only_database_out(deployment: Deployment) -> None:
    waiting = tuned(deployment, max_wait_s=0.1, backoff_max_s=1.0)
    event = make_event("ada", "I live in Lisbon")
    waiting.publish([event])
    read_only(deployment.dsn, on=True)
    with wiring.core(waiting.settings) as c:
        processor = waiting.processor(c)
        processor.start()

        def refused_twice() -> bool:
            processor.step()
            return processor.outage.failures >= 2

        def settled() -> bool:
            processor.step()
            return not processor.held_events() and not processor.outage.failures

        try:
            wait_until(refused_twice, 120, "two flushes refused")
            assert [e.event_id for e in processor.held_events()] == [event.event_id]
            read_only(deployment.dsn, on=False)
            wait_until(settled, 120, "the batch settled")
        finally:
            processor.shutdown()
    consumed = deployment.query("SELECT event_id FROM consolidated_events")
    assert consumed == [(event.event_id,)]
    assert deployment.query("SELECT status FROM consolidation_runs") == [("succeeded",)]
    k = deployment.settings.kafka
    assert letter_count(k.bootstrap_servers, k.dead_letter_topic) == 0


class Costly(FlakyBackend):
    """The offline backend's answers, with the tokens a paid model's call would report."""

    def consolidate(self, request: ConsolidationRequest) -> BackendResponse:
        return replace(super().consolidate(request), usage=USAGE)


@contextmanager
def app_role(deployment: Deployment) -> Iterator[str]:
    """A role with the privileges the pipeline needs and no more (a superuser is never
    refused one): yields its name, dropped after."""
    role = f"app_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(deployment.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        for what, privilege in (("TABLES", "ALL"), ("SEQUENCES", "ALL"), ("FUNCTIONS", "EXECUTE")):
            grant = f"GRANT {privilege} ON ALL {what} IN SCHEMA public TO {{}}"
            conn.execute(sql.SQL(grant).format(sql.Identifier(role)))
    try:
        yield role
    finally:
        with psycopg.connect(deployment.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def refuse(deployment: Deployment, role: str, refusal: str, *, on: bool) -> None:
    """Refuse the role's writes (or take them again): the database read-only, or the
    privilege to record runs revoked (SQLSTATE 42501), the last write of a run's transaction."""
    if refusal == "read-only":
        read_only(deployment.dsn, on=on)
        return
    verb = (
        "REVOKE INSERT ON consolidation_runs FROM {}"
        if on
        else ("GRANT INSERT ON consolidation_runs TO {}")
    )
    with psycopg.connect(deployment.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL(verb).format(sql.Identifier(role)))


@pytest.mark.parametrize("refusal", ["read-only", "privilege-revoked"])
def test_retries_through_refused_writes_call_the_backend_once(
    deployment: Deployment, refusal: str
) -> None:
    """Every retry during the outage reads the memory and tries its write again, but the
    answer is the first call's: paid once, and booked once when the write lands."""
    event = make_event("ada", "I live in Lisbon")
    backend = Costly()
    with app_role(deployment) as role:
        params = {**conninfo_to_dict(deployment.dsn), "user": role}
        postgres = deployment.settings.postgres.model_copy(
            update={"dsn": make_conninfo("", **params)}
        )
        app = Deployment(
            deployment.settings.model_copy(update={"postgres": postgres}), deployment.dsn
        )
        waiting = tuned(app, max_wait_s=0.1, backoff_base_s=0.05, backoff_max_s=0.2)
        waiting.publish([event])
        refuse(deployment, role, refusal, on=True)
        with wiring.core(waiting.settings) as c:
            processor = waiting.processor(c, backend)
            processor.start()

            def refused_four_times() -> bool:
                processor.step()
                return processor.outage.failures >= 4

            def settled() -> bool:
                processor.step()
                return not processor.held_events() and not processor.outage.failures

            try:
                wait_until(refused_four_times, 120, "four flushes refused")
                assert [e.event_id for e in processor.held_events()] == [event.event_id]
                assert backend.calls == 1
            finally:
                refuse(deployment, role, refusal, on=False)
            try:
                wait_until(settled, 120, "the batch settled")
            finally:
                processor.shutdown()
    assert backend.calls == 1
    assert deployment.query("SELECT status FROM consolidation_runs") == [("succeeded",)]
    booked = deployment.query("SELECT units FROM credit_ledger WHERE operation = 'llm'")
    assert booked == [(USAGE.total,)]
    k = deployment.settings.kafka
    assert letter_count(k.bootstrap_servers, k.dead_letter_topic) == 0
