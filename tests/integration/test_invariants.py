"""The invariant checker on a real pipeline run: clean, then each invariant broken on purpose.

The pipeline runs once (real Kafka, Postgres; offline backend). Each case then works on its
own copy of the database (`CREATE DATABASE ... TEMPLATE`), breaks one promise with plain SQL
the way a bug would, and the checker must count exactly that damage and nothing else.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool

from domain.ids import MemoryKey
from memoryd import wiring
from memoryd.analyst import invariants
from memoryd.analyst.dead_letters import SeenLetter, read_dead_letters
from memoryd.analyst.invariants import check_deployment, check_invariants
from memoryd.erasure import ErasureRequest
from store.postgres import make_pool
from tests.support.builders import key_of, make_event, make_fact, seed
from tests.support.deployment import Deployment

pytestmark = pytest.mark.integration

Expected = dict[MemoryKey, set[uuid.UUID]]
Letters = list[SeenLetter]
# A case breaks something in a database copy and may change what the checker is given.
Case = Callable[[psycopg.Connection[Any], Expected, Letters], None]

_COPY_EVENT = (
    "INSERT INTO context_events (event_id, schema_version, user_id, organization_id, event_type,"
    " content, source, occurred_at) SELECT %s, schema_version, user_id, organization_id,"
    " event_type, content, source, occurred_at FROM context_events WHERE event_id = %s"
)
_RUN_COPY_COLUMNS = (
    "user_id, organization_id, backend, model, prompt_version, base_version, output,"
    " raw_response, gate, duration_ms, started_at"
)


def _one(conn: psycopg.Connection[Any], query: str) -> Any:
    row = conn.execute(query).fetchone()
    assert row is not None, query
    return row[0]


def _a_consumed_event(conn: psycopg.Connection[Any]) -> uuid.UUID:
    return _one(conn, "SELECT event_id FROM consolidated_events ORDER BY event_id LIMIT 1")


def _missing(_c: psycopg.Connection[Any], expected: Expected, _l: Letters) -> None:
    expected[next(iter(expected))].add(uuid.uuid4())


def _unexpected(conn: psycopg.Connection[Any], _e: Expected, _l: Letters) -> None:
    conn.execute(_COPY_EVENT, (uuid.uuid4(), _a_consumed_event(conn)))


def _doubled_in_log(conn: psycopg.Connection[Any], _e: Expected, _l: Letters) -> None:
    conn.execute("ALTER TABLE context_events DROP CONSTRAINT context_events_memory_event")
    event = _a_consumed_event(conn)
    conn.execute(_COPY_EVENT, (event, event))


def _unconsumed(conn: psycopg.Connection[Any], _e: Expected, _l: Letters) -> None:
    conn.execute("DELETE FROM consolidated_events WHERE event_id = %s", (_a_consumed_event(conn),))


def _unconsumed_but_dead_lettered(
    conn: psycopg.Connection[Any], _e: Expected, letters: Letters
) -> None:
    event = _a_consumed_event(conn)
    org, user = conn.execute(
        "SELECT organization_id, user_id FROM consolidated_events WHERE event_id = %s", (event,)
    ).fetchall()[0]
    conn.execute("DELETE FROM consolidated_events WHERE event_id = %s", (event,))
    letters.append(
        SeenLetter(
            "processor", "consolidate", "backend error", ("t", 0, 99), MemoryKey(org, user), event
        )
    )


def _consumed_by_no_run(conn: psycopg.Connection[Any], _e: Expected, _l: Letters) -> None:
    conn.execute(
        "UPDATE consolidated_events SET run_id = %s WHERE event_id = %s",
        (uuid.uuid4(), _a_consumed_event(conn)),
    )


def _run_copied(status: str, attempt: int, times: int = 1) -> Case:
    """A copy (or several) of a succeeded run, over its first event only, under new ids."""

    def case(conn: psycopg.Connection[Any], _e: Expected, _l: Letters) -> None:
        for _ in range(times):
            conn.execute(
                f"INSERT INTO consolidation_runs (run_id, attempt, status, input_event_ids,"
                f" {_RUN_COPY_COLUMNS}) SELECT %s, %s, %s, input_event_ids[1:1],"
                f" {_RUN_COPY_COLUMNS} FROM consolidation_runs WHERE status = 'succeeded'"
                " ORDER BY seq LIMIT 1",
                (uuid.uuid4(), attempt, status),
            )

    return case


def _fact_copied(conn: psycopg.Connection[Any], _e: Expected, _l: Letters) -> None:
    columns = (
        "user_id, organization_id, context_type, source, connection_id, fact_type, surface,"
        " status, confidence, salience, created_by_run, created_at, updated_at"
    )
    conn.execute(
        f"INSERT INTO memory_facts (fact_id, content, {columns})"
        f" SELECT %s, upper(content), {columns} FROM memory_facts"
        " WHERE status = 'active' ORDER BY fact_id LIMIT 1",
        (uuid.uuid4(),),
    )


def _ledger_copied(operation: str, later: bool = False) -> Case:
    """A copy of a ledger entry under a new id, at the same instant or a second later."""

    def case(conn: psycopg.Connection[Any], _e: Expected, _l: Letters) -> None:
        columns = "user_id, organization_id, run_id, operation, model, units, cost_micro_usd"
        conn.execute(
            f"INSERT INTO credit_ledger (entry_id, occurred_at, {columns})"
            f" SELECT %s, occurred_at + %s * interval '1 second', {columns} FROM credit_ledger"
            " WHERE operation = %s AND run_id IS NOT NULL ORDER BY seq LIMIT 1",
            (uuid.uuid4(), int(later), operation),
        )

    return case


def _embedding_copied(conn: psycopg.Connection[Any], _e: Expected, _l: Letters) -> None:
    """One fact version's embedding booked a second time, in an entry of its own."""
    conn.execute(
        "INSERT INTO credit_ledger (entry_id, user_id, organization_id, run_id, operation,"
        " model, units, cost_micro_usd, occurred_at) SELECT %s, user_id, organization_id,"
        " run_id, operation, model, 1, cost_micro_usd, occurred_at FROM credit_ledger"
        " WHERE operation = 'embedding' ORDER BY seq LIMIT 1",
        (uuid.uuid4(),),
    )


def _letter_twice(_c: psycopg.Connection[Any], _e: Expected, letters: Letters) -> None:
    letters.append(letters[0])


def _letter_without_reason(_c: psycopg.Connection[Any], _e: Expected, letters: Letters) -> None:
    letters[0] = replace(letters[0], reason=" ")


def _memory_tampered(conn: psycopg.Connection[Any], _e: Expected, _l: Letters) -> None:
    conn.execute("UPDATE user_memory SET working_memory = 'behind the runs' WHERE user_id = 'ada'")


CASES: dict[str, tuple[Case, dict[str, int]]] = {
    "missing_from_log": (_missing, {"missing_from_log": 1}),
    "unexpected_in_log": (_unexpected, {"unexpected_in_log": 1, "unaccounted": 1}),
    "doubled_in_log": (_doubled_in_log, {"doubled_in_log": 1}),
    "unaccounted": (_unconsumed, {"unaccounted": 1}),
    "dead_lettered_is_accounted": (_unconsumed_but_dead_lettered, {}),
    "consolidated_without_run": (_consumed_by_no_run, {"consolidated_without_run": 1}),
    # An event in a second succeeded run: consolidated twice, and the fold no longer matches.
    "consolidated_twice": (
        _run_copied("succeeded", attempt=7),
        {"consolidated_twice": 1, "diverged_memories": 1},
    ),
    # One succeeded run recorded twice under two ids.
    "doubled_runs": (
        _run_copied("succeeded", attempt=0, times=2),
        {"doubled_runs": 1, "consolidated_twice": 2, "diverged_memories": 1},
    ),
    # A failed run repeated (a redriven event failing again) is no double.
    "failed_again": (_run_copied("failed", attempt=1, times=2), {}),
    "doubled_facts": (_fact_copied, {"doubled_facts": 1, "diverged_memories": 1}),
    "doubled_ledger": (_ledger_copied("llm"), {"doubled_ledger": 1}),
    "doubled_embedding": (_embedding_copied, {"doubled_ledger": 1}),
    "doubled_dead_letters": (_letter_twice, {"doubled_dead_letters": 1}),
    "letters_without_reason": (_letter_without_reason, {"letters_without_reason": 1}),
    "diverged_memories": (_memory_tampered, {"diverged_memories": 1}),
}


def _dsn_for(dsn: str, dbname: str) -> str:
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo("", **params)


@pytest.fixture
def database_copies(fresh_database: str) -> Iterator[Callable[[], str]]:
    """Copies of the test's database as it is when a copy is asked for; dropped afterwards."""
    made: list[str] = []
    admin = _dsn_for(fresh_database, "postgres")
    template = str(conninfo_to_dict(fresh_database)["dbname"])

    def copy() -> str:
        name = f"{template}_c{len(made)}"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(template)
                )
            )
        made.append(name)
        return _dsn_for(fresh_database, name)

    yield copy
    with psycopg.connect(admin, autocommit=True) as conn:
        for name in made:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _events_of(users: Sequence[str]) -> list[Any]:
    topics = ["billing API", "design review", "on-call rota", "Falcon launch", "budget"]
    return [
        make_event(user, f"{user} works on the {topic} this week", minutes=i)
        for user in users
        for i, topic in enumerate(topics)
    ]


def test_the_checker_counts_each_broken_invariant(
    deployment: Deployment, database_copies: Callable[[], str]
) -> None:
    events = _events_of(["ada", "bob", "cy"])
    deployment.publish(events)
    deployment.produce_raw([b"not json at all"])
    deployment.run_both()
    expected: Expected = {}
    for e in events:
        expected.setdefault(key_of(e.user_id), set()).add(e.event_id)

    report = check_deployment(deployment.settings, expected)
    assert report.violations() == {}, report.summary()
    # The undecodable record is dead-lettered once by each consumer, and is no event.
    assert (report.expected, report.logged, report.consolidated) == (15, 15, 15)
    assert (report.dead_lettered, report.memories) == (2, 3)
    k = deployment.settings.kafka
    letters_seen = read_dead_letters(k.bootstrap_servers, k.dead_letter_topic)
    assert len(letters_seen) == 2
    charged = dict(deployment.query("SELECT operation, count(*) FROM credit_ledger GROUP BY 1"))
    assert charged["llm"] > 0
    assert charged["embedding"] > 0

    for name, (case, broken) in CASES.items():
        dsn = database_copies()
        want = {k: set(v) for k, v in expected.items()}
        letters = list(letters_seen)
        with psycopg.connect(dsn) as conn:
            case(conn, want, letters)
        pool = make_pool(dsn, max_size=2)
        try:
            got = check_invariants(pool, want, letters)
        finally:
            pool.close()
        assert got.violations() == broken, f"{name}: {got.summary()}"
        for violated in broken:
            assert got.details[violated], f"{name}: no culprit named for {violated}"


def test_a_fact_erasure_leaves_the_ledger_whole_and_a_double_still_counts(
    deployment: Deployment,
) -> None:
    quokka = make_fact("mira", "Bramble is a quokka")
    quoting = make_fact("mira", "Mira said Bramble is a quokka at the zoo")
    with wiring.core(deployment.settings) as c, closing(wiring.publisher(c.settings)) as pub:
        indexer = wiring.indexer(c)
        indexer.index_changes(seed(c.memory, "mira", [quokka, make_fact("mira", "Mira sings")]))
        indexer.index_changes(seed(c.memory, "mira", [quoting]))  # booked in a batch alone
        request = ErasureRequest("test", "asked by the user")
        wiring.eraser(c, pub).erase_fact(key_of("mira"), quokka.fact_id, request)
        indexer.drain_pending()  # the redacted fact, embedded and booked again
        assert c.memory.pending_backlog().count == 0
        # Seeded, the memory is no fold of runs: the ledger is what is looked at here.
        report = check_invariants(c.pool, {}, [])
        assert report.doubled_ledger == 0, report.summary()
        with c.pool.connection() as conn:
            _embedding_copied(conn, {}, [])
        report = check_invariants(c.pool, {}, [])
        assert report.doubled_ledger == 1, report.summary()


def test_a_deployment_is_checked_through_read_only_transactions(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused: list[type[Exception]] = []

    def probing(pool: ConnectionPool, *args: Any) -> invariants.InvariantReport:
        # What a buggy check writing through the checker's pool would meet.
        with pool.connection() as conn:
            try:
                conn.execute("CREATE TABLE written_by_a_check (x int)")
            except psycopg.errors.ReadOnlySqlTransaction as e:
                refused.append(type(e))
                conn.rollback()
        return check_invariants(pool, *args)

    monkeypatch.setattr(invariants, "check_invariants", probing)
    report = check_deployment(deployment.settings, {})
    assert report.ok, report.summary()
    assert refused == [psycopg.errors.ReadOnlySqlTransaction]
    tables = deployment.query("SELECT to_regclass('written_by_a_check')::text")
    assert tables == [(None,)]
