"""Migration 0004 brings data written under user-only keys over to (organization, user) keys."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from store.migrate import migrate
from store.postgres import make_pool

pytestmark = pytest.mark.integration

RUN_A, RUN_B = uuid.UUID(int=10), uuid.UUID(int=11)
EVENT_A, EVENT_B = uuid.UUID(int=20), uuid.UUID(int=21)
FACT_A = uuid.UUID(int=30)


def legacy_rows(conn: psycopg.Connection[Any]) -> None:
    """What a deployment at migration 0003 holds: ada of org-a, bob of org-b."""
    conn.execute(
        "INSERT INTO context_events (event_id, schema_version, user_id, organization_id,"
        " event_type, content, source, occurred_at) VALUES"
        " (%s, 1, 'ada', 'org-a', 'fact', 'I live in Lisbon', 'interactive', now()),"
        " (%s, 1, 'bob', 'org-b', 'fact', 'I live in Porto', 'interactive', now())",
        (EVENT_A, EVENT_B),
    )
    for run, user, org in ((RUN_A, "ada", "org-a"), (RUN_B, "bob", "org-b")):
        conn.execute(
            "INSERT INTO consolidation_runs (run_id, user_id, organization_id, input_event_ids,"
            " backend, model, prompt_version, status, base_version, duration_ms, started_at)"
            " VALUES (%s, %s, %s, '{}', 'offline', 'm', 'p', 'succeeded', 0, 1, now())",
            (run, user, org),
        )
    conn.execute(
        "INSERT INTO consolidated_events (event_id, run_id, user_id) VALUES"
        " (%s, %s, 'ada'), (%s, %s, 'bob')",
        (EVENT_A, RUN_A, EVENT_B, RUN_B),
    )
    conn.execute(
        "INSERT INTO user_memory (user_id, organization_id, working_memory, version)"
        " VALUES ('ada', 'org-a', 'Ada lives in Lisbon.', 1), ('bob', 'org-b', '', 1)"
    )
    conn.execute(
        "INSERT INTO connections (user_id, connection_id, organization_id)"
        " VALUES ('ada', 'gmail', 'org-a')"
    )
    conn.execute(
        "INSERT INTO memory_facts (fact_id, user_id, organization_id, content, context_type,"
        " source, fact_type, surface, status, confidence, salience, created_by_run,"
        " created_at, updated_at) VALUES (%s, 'ada', 'org-a', 'Ada lives in Lisbon', 'fact',"
        " 'interactive', 'profile', 'speak', 'active', 0.9, 0.5, %s, now(), now())",
        (FACT_A, RUN_A),
    )
    conn.execute(
        "INSERT INTO credit_ledger (entry_id, user_id, organization_id, run_id, operation,"
        " model, units, cost_micro_usd, occurred_at)"
        " VALUES (gen_random_uuid(), 'bob', 'org-b', %s, 'llm', 'm', 10, 5, now())",
        (RUN_B,),
    )
    # Credit lines had no organization: one for a user with memory, one with only a ledger.
    conn.execute(
        "INSERT INTO user_credits (user_id, credit_micro_usd) VALUES ('ada', 100), ('bob', 50)"
    )
    conn.execute(
        "INSERT INTO context_logs (log_id, user_id, organization_id, query, memory_version,"
        " injected, retrieved, latency_ms, degraded) VALUES"
        " (gen_random_uuid(), 'ada', NULL, 'where?', 1, '{}', '[]', 1.0, false)"
    )
    conn.execute(
        "INSERT INTO erasure_audit (user_id, actor, reason, rows_erased)"
        " VALUES ('carol', 'dpo', 'GDPR request', 3)"
    )


def test_existing_rows_keep_their_organization_and_get_the_new_keys(fresh_database: str) -> None:
    pool = make_pool(fresh_database, max_size=2)
    try:
        assert [m.version for m in migrate(pool, target=3)] == [1, 2, 3]
        with pool.connection() as conn:
            legacy_rows(conn)
        assert [m.name for m in migrate(pool, target=4)] == ["tenancy"]
        # Later migrations apply on top of the tenancy schema.
        assert [m.name for m in migrate(pool)] == [
            "discarded_runs",
            "fact_time_and_subject",
            "operations",
            "memory_changes",
            "fact_recalls",
            "fact_write_transactions",
            "fact_erasure_sources",
            "forgotten_ledger_ids",
            "job_successes",
            "redacted_events",
            "maintenance_skips",
            "fact_erasure_completeness",
            "run_finish_times",
            "connection_info_cap",
            "job_heartbeats",
            "fact_erasure_job_errors",
            "erasure_text_matching",
            "job_run_epochs",
            "fact_erasure_targets",
            "erasure_escaped_text",
            "erasure_escapes_where_backslash",
        ]
    finally:
        pool.close()
    with psycopg.connect(fresh_database) as conn:

        def rows(sql: str) -> list[tuple[Any, ...]]:
            return conn.execute(sql).fetchall()

        assert rows(
            "SELECT organization_id, user_id, event_id FROM consolidated_events ORDER BY 2"
        ) == [("org-a", "ada", EVENT_A), ("org-b", "bob", EVENT_B)]
        assert rows(
            "SELECT organization_id, user_id, credit_micro_usd FROM user_credits ORDER BY 2"
        ) == [("org-a", "ada", 100), ("org-b", "bob", 50)]
        assert rows("SELECT organization_id FROM context_logs") == [("org-a",)]
        assert rows(
            "SELECT organization_id, user_id, balance_micro_usd FROM user_balances ORDER BY 2"
        ) == [("org-a", "ada", 100), ("org-b", "bob", 45)]
        assert rows(
            "SELECT organization_id, user_id, processed FROM context_events_status ORDER BY 2"
        ) == [("org-a", "ada", True), ("org-b", "bob", True)]
        # The old audit row keeps its count, but no longer the user id in clear.
        ((subject, scope, status, removed),) = rows(
            "SELECT subject, scope, status, removed FROM erasure_audit"
        )
        assert subject.startswith("sha256:")
        assert "carol" not in subject
        assert (scope, status) == ("events", "completed")
        assert removed == {"postgres": {"context_events": 3}}
        columns = rows(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'erasure_audit'"
        )
        assert ("user_id",) not in columns
        # The same user id can now have a memory in another organization.
        conn.execute("INSERT INTO user_memory (organization_id, user_id) VALUES ('org-b', 'ada')")
        conn.execute(
            "INSERT INTO connections (organization_id, user_id, connection_id)"
            " VALUES ('org-b', 'ada', 'gmail')"
        )
        assert rows("SELECT count(DISTINCT generation) FROM user_memory") == [(3,)]
        # An erasure's deletes check the superseded_by foreign key through this index.
        assert rows(
            "SELECT count(*) FROM pg_indexes WHERE indexname = 'memory_facts_superseded_by'"
        ) == [(1,)]
