"""What an erasure redacts, on real Postgres (migration 0021): the erased text as whole words
only, in every case variant Python's casefold takes for the same fact, and what a quote cut
short kept of it, also in the read audit's degraded reason; and (0024) the text as Python
escapes it in JSON with `ensure_ascii` and in `repr`/`ascii`."""

from __future__ import annotations

import json
import sys
import uuid
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pydantic
import pytest
from psycopg_pool import ConnectionPool

from domain.ids import SubjectHasher
from domain.model import RunStatus
from producers.contract import EventType
from store.errors import StoreError
from store.read.fact_queries import PostgresReadModel
from store.write.cluster_jobs import ClusterJobs
from store.write.erasure_log import PostgresErasureLog
from store.write.event_log import PostgresEventLog
from store.write.maintenance_queries import MaintenanceQueries, MaintenanceRunRow
from store.write.memory_store import PostgresMemoryStore
from tests.support.builders import BASE_TIME, key_of, log_row, make_event, make_fact, make_run, seed
from tests.support.erasure import (
    SUBJECTS,
    find_in_tables,
    open_fact_erasure,
    open_memory_erasure,
    rows,
)

pytestmark = pytest.mark.integration

ADA = key_of("ada")


def _fail_job(pool: ConnectionPool, job: str, error: str) -> None:
    def fail() -> None:
        raise StoreError(error)

    with pytest.raises(StoreError):
        ClusterJobs(pool, lambda: BASE_TIME).run_if_due(job, timedelta(hours=1), fail)


def _failed_maintenance(pool: ConnectionPool, error: str) -> None:
    row = MaintenanceRunRow(uuid.uuid4(), "dedupe", BASE_TIME, "failed", 3, {"merge": 2}, {}, error)
    MaintenanceQueries(pool).record_run(row)


def _erase(pool: ConnectionPool, fact_id: uuid.UUID) -> dict[str, Any]:
    log = PostgresErasureLog(pool)
    return log.erase_fact(open_fact_erasure(log, ADA, fact_id), ADA, fact_id, {})


def _errors(dsn: str) -> list[str]:
    return [
        e
        for (e,) in rows(
            dsn,
            "SELECT error FROM maintenance_runs UNION ALL SELECT last_error FROM scheduled_jobs"
            " UNION ALL SELECT error FROM consolidation_runs WHERE error IS NOT NULL",
        )
    ]


def test_a_fact_s_text_is_redacted_as_whole_words_only(
    migrated_pool: ConnectionPool, fresh_database: str
) -> None:
    memory = PostgresMemoryStore(migrated_pool)
    erased = make_fact("ada", "database")
    longer = make_fact("ada", "Ada tunes databases")
    seed(
        memory,
        "ada",
        [erased, longer],
        working_memory="Ada designs databases; her database is down.\nAn old Database.",
    )
    events = [make_event("ada", "I love databases", minutes=0), make_event("ada", "my database")]
    PostgresEventLog(migrated_pool, SubjectHasher(b"k" * 32)).append([(e, None) for e in events])
    # The model's answer as the run logged it: JSON, where a word may follow an escape.
    answer = '{"updated_working_memory": "Ada:\\ndatabase, databases"}'
    memory.record_run(
        replace(
            make_run("ada", seq=2, version=2, status=RunStatus.FAILED).run,
            raw_response=answer,
            error="output is not JSON: database_url",
        )
    )
    _fail_job(migrated_pool, "maintenance-dedupe", "connection to databases lost")
    _fail_job(migrated_pool, "maintenance-index", "the database is gone")

    receipt = _erase(migrated_pool, erased.fact_id)

    assert rows(fresh_database, "SELECT working_memory FROM user_memory") == [
        ("Ada designs databases; her [erased] is down.\nAn old [erased].",)
    ]
    # A fact saying a longer word keeps its text, and is not rewritten (nor indexed again).
    assert [f.content for f in memory.facts_by_id([longer.fact_id])] == ["Ada tunes databases"]
    assert receipt["redacted"]["memory_facts"] == 0
    assert rows(fresh_database, "SELECT content FROM context_events ORDER BY content") == [
        ("I love databases",),
        ("[erased]",),
    ]
    assert rows(
        fresh_database, "SELECT raw_response, error FROM consolidation_runs WHERE error IS NOT NULL"
    ) == [
        (
            '{"updated_working_memory": "Ada:\\n[erased], databases"}',
            "output is not JSON: database_url",
        )
    ]
    assert sorted(_errors(fresh_database)) == [
        "StoreError: connection to databases lost",
        "StoreError: the [erased] is gone",
        "output is not JSON: database_url",
    ]


@pytest.mark.parametrize(
    ("text", "wording", "redacted"),
    [
        # Not word characters at its ends: the text is found next to anything.
        ("#bramble!", "Ada wrote x#Bramble!! twice", "Ada wrote x[erased]! twice"),
        # Quotes count as non-word characters, whichever side.
        ("Bramble's", "Bramble's bowl, Brambles' bowls", "[erased] bowl, Brambles' bowls"),
    ],
)
def test_a_text_ending_in_another_character_is_found_next_to_anything(
    migrated_pool: ConnectionPool, fresh_database: str, text: str, wording: str, redacted: str
) -> None:
    memory = PostgresMemoryStore(migrated_pool)
    erased = make_fact("ada", text)
    seed(memory, "ada", [erased], working_memory=wording)
    _erase(migrated_pool, erased.fact_id)
    assert rows(fresh_database, "SELECT working_memory FROM user_memory") == [(redacted,)]


def test_a_forget_redacts_the_cluster_jobs_errors_as_whole_words(
    migrated_pool: ConnectionPool, fresh_database: str
) -> None:
    memory = PostgresMemoryStore(migrated_pool)
    seed(memory, "ada", [make_fact("ada", "Portuguese")])
    _failed_maintenance(migrated_pool, "dedupe failed: (Portuguese)")
    _failed_maintenance(migrated_pool, "dedupe failed: Portuguese-speaking users")
    _fail_job(migrated_pool, "maintenance-dedupe", "no locale PortugueseBR")

    log = PostgresErasureLog(migrated_pool)
    erasure_id = open_memory_erasure(log, ADA, "subject-of-ada")
    log.erase_memory(erasure_id, ADA, "subject-of-ada", {})

    assert sorted(_errors(fresh_database)) == [
        "StoreError: no locale PortugueseBR",
        "dedupe failed: ([erased])",
        "dedupe failed: [erased]-speaking users",
    ]


QUOKKA = "Ada keeps a pet quokka named Bramble since the spring of 2019"


def _pydantic_error(value: str) -> str:
    """What pydantic says of `value` where a number was due: it shows a long value shortened."""
    try:
        pydantic.TypeAdapter(int).validate_python(value)
    except pydantic.ValidationError as e:
        return f"output does not match the schema: {e}"
    raise AssertionError("validated")


def test_what_a_quote_cut_short_kept_of_the_fact_is_redacted(
    migrated_pool: ConnectionPool, fresh_database: str
) -> None:
    memory = PostgresMemoryStore(migrated_pool)
    erased = make_fact("ada", QUOKKA)
    seed(memory, "ada", [erased, make_fact("ada", "Bob keeps bees in the garden")])
    shown = _pydantic_error(QUOKKA)
    head, tail = QUOKKA[:24], QUOKKA[-23:]
    assert f"'{head}...{tail}'" in shown  # pydantic's, not the whole text
    # An answer stopped by the token cap, an error cut to a length: the quote's start only.
    stopped = '{"facts": [{"content": "ada keeps a pet QUOKKA nam'
    memory.record_run(
        replace(
            make_run("ada", seq=2, version=2, status=RunStatus.FAILED).run,
            error=shown,
            raw_response=stopped,
        )
    )
    _failed_maintenance(migrated_pool, f"dedupe failed: ({QUOKKA})"[:40])
    _fail_job(migrated_pool, "maintenance-dedupe", f"value {QUOKKA[:30]}... too long")
    # Under 8 characters, or not the fact's start or end, a piece at a cut is no quote of it.
    _fail_job(migrated_pool, "maintenance-index", "Ada kee... and Bob keeps bees...")
    degraded = f"vector index unavailable: 400 input too long: {QUOKKA}"[:70]
    reads = PostgresReadModel(migrated_pool, SUBJECTS)
    row = log_row(ADA, generation=None)
    reads.write_context_logs([replace(row, degraded=True, degraded_reason=degraded)])

    _erase(migrated_pool, erased.fact_id)

    assert find_in_tables(fresh_database, [head, tail, "quokka"]) == {}
    assert rows(
        fresh_database, "SELECT raw_response FROM consolidation_runs WHERE error IS NOT NULL"
    ) == [('{"facts": [{"content": "[erased]',)]
    assert rows(fresh_database, "SELECT degraded_reason FROM context_logs") == [
        ("vector index unavailable: 400 input too long: [erased]",)
    ]
    errors = _errors(fresh_database)
    assert "dedupe failed: ([erased]" in errors
    assert "StoreError: value [erased]... too long" in errors
    assert "StoreError: Ada kee... and Bob keeps bees..." in errors
    run_error = next(e for e in errors if e.startswith("output"))
    assert "input_value='[erased]...[erased]'" in run_error


def test_the_read_audit_s_degraded_reason_loses_the_fact_s_text(
    migrated_pool: ConnectionPool, fresh_database: str
) -> None:
    # The reason is the index's error, which may quote the query, and the query the fact.
    memory = PostgresMemoryStore(migrated_pool)
    erased = make_fact("ada", "Ada keeps a pet quokka")
    seed(memory, "ada", [erased])
    asked = "does Ada keep a pet quokka? Ada keeps a pet quokka"
    reason = f"vector index unavailable: cannot embed '{asked}'"
    reads = PostgresReadModel(migrated_pool, SUBJECTS)
    reads.write_context_logs(
        [replace(log_row(ADA, generation=None), degraded=True, degraded_reason=reason)]
    )

    receipt = _erase(migrated_pool, erased.fact_id)

    assert rows(fresh_database, "SELECT degraded_reason FROM context_logs") == [
        ("vector index unavailable: cannot embed 'does Ada keep a pet quokka? [erased]'",)
    ]
    assert receipt["redacted"]["context_logs"] == 1


@pytest.mark.parametrize(
    ("text", "wording"),
    [
        ("Édith walks on the Straße", "ÉDITH WALKS ON THE STRASSE"),
        ("ADA LIVES ON THE STRASSE", "ada lives on the straße"),
        ("Οδυσσεύς sails home", "ΟΔΥΣΣΕΎΣ SAILS HOME"),
        ("ΟΔΥΣΣΕΎΣ SAILS HOME", "οδυσσεύς sails home"),
        ("İpek lives in İstanbul", "i\u0307pek lives in i\u0307stanbul"),
    ],
)
def test_every_case_variant_python_folds_to_the_fact_is_redacted(
    migrated_pool: ConnectionPool, fresh_database: str, text: str, wording: str
) -> None:
    memory = PostgresMemoryStore(migrated_pool)
    erased = make_fact("ada", text)
    # Python's rule (domain.ids.normalize_content): the two wordings are one fact.
    assert make_fact("ada", wording).fact_id == erased.fact_id
    seed(memory, "ada", [erased], working_memory=f"Said: {wording}. Ada plays cello.")
    _erase(migrated_pool, erased.fact_id)
    assert rows(fresh_database, "SELECT working_memory FROM user_memory") == [
        ("Said: [erased]. Ada plays cello.",)
    ]


def test_the_case_folds_are_python_s(migrated_pool: ConnectionPool) -> None:
    with migrated_pool.connection() as conn:
        stored = dict(conn.execute("SELECT ch, folded FROM case_folds").fetchall())
    python = {
        c: c.casefold()
        for c in map(chr, range(sys.maxunicode + 1))
        if not 0xD800 <= ord(c) < 0xE000 and c.casefold() != c
    }
    assert stored == python


# Non-ASCII in the Latin-1 range, beyond it, and beyond the BMP (a surrogate pair in JSON).
ESCAPED = "Renée moved to Zürich near the Ŧarn 🌲"


def test_a_fact_s_text_escaped_as_python_writes_json_and_repr_is_redacted(
    migrated_pool: ConnectionPool, fresh_database: str
) -> None:
    memory = PostgresMemoryStore(migrated_pool)
    erased = make_fact("ada", ESCAPED)
    seed(memory, "ada", [erased], working_memory=f"Ada said: {ESCAPED}.")
    as_json = json.dumps(ESCAPED)  # ensure_ascii, json.dumps's default
    assert "Ren\\u00e9e" in as_json
    assert "\\ud83c\\udf32" in as_json
    # A client's scaffold update, JSON as its Python client wrote it (not a source of the fact).
    update = make_event(
        "ada", json.dumps({"note": ESCAPED}), EventType.SCAFFOLD_UPDATE, scaffold_key="Notes"
    )
    PostgresEventLog(migrated_pool, SubjectHasher(b"k" * 32)).append([(update, None)])
    memory.record_run(
        replace(
            make_run("ada", seq=2, version=2, status=RunStatus.FAILED).run,
            raw_response=json.dumps({"updated_working_memory": f"Ada: {ESCAPED}"}),
            error=f"value refused: {ESCAPED!a}",
        )
    )
    reads = PostgresReadModel(migrated_pool, SUBJECTS)
    reason = f"vector index unavailable: cannot embed {as_json}"
    reads.write_context_logs(
        [replace(log_row(ADA, generation=None), degraded=True, degraded_reason=reason)]
    )
    _fail_job(migrated_pool, "maintenance-dedupe", f"dedupe failed: {as_json}")

    _erase(migrated_pool, erased.fact_id)

    escapes = ["ren\\u00e9e", "ren\\xe9e", "z\\u00fcrich", "\\u0166arn", "\\U0001f332"]
    assert find_in_tables(fresh_database, ["Renée", "Zürich", *escapes]) == {}
    assert rows(
        fresh_database, "SELECT raw_response, error FROM consolidation_runs WHERE error IS NOT NULL"
    ) == [('{"updated_working_memory": "Ada: [erased]"}', "value refused: '[erased]'")]
    assert rows(fresh_database, "SELECT degraded_reason FROM context_logs") == [
        ('vector index unavailable: cannot embed "[erased]"',)
    ]
    assert rows(fresh_database, "SELECT content FROM context_events") == [('"[erased]"',)]
    assert sorted(_errors(fresh_database)) == [
        'StoreError: dedupe failed: "[erased]"',
        "value refused: '[erased]'",
    ]


def test_a_forget_redacts_a_quote_json_wrote_with_ensure_ascii(
    migrated_pool: ConnectionPool, fresh_database: str
) -> None:
    memory = PostgresMemoryStore(migrated_pool)
    seed(memory, "ada", [make_fact("ada", ESCAPED)])
    _failed_maintenance(migrated_pool, f"dedupe failed: {json.dumps({'c': ESCAPED})}")

    log = PostgresErasureLog(migrated_pool)
    erasure_id = open_memory_erasure(log, ADA, "subject-of-ada")
    log.erase_memory(erasure_id, ADA, "subject-of-ada", {})

    assert _errors(fresh_database) == ['dedupe failed: {"c": "[erased]"}']
