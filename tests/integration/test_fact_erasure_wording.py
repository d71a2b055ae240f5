"""A fact erasure finds the fact's text whatever its case and spacing, on real Postgres: the
fact's id is of its normalized text, so one fact may have been written several ways."""

from __future__ import annotations

import json

import pytest
from psycopg_pool import ConnectionPool

from domain.ids import SubjectHasher
from store.write.erasure_log import PostgresErasureLog
from store.write.event_log import PostgresEventLog
from store.write.memory_store import PostgresMemoryStore
from tests.support.builders import key_of, make_event, make_fact, seed
from tests.support.erasure import find_in_tables, open_fact_erasure, rows

pytestmark = pytest.mark.integration

ADA = key_of("ada")


def test_every_wording_of_the_fact_loses_its_text(
    migrated_pool: ConnectionPool, fresh_database: str
) -> None:
    memory = PostgresMemoryStore(migrated_pool)
    first = make_fact("ada", "ada keeps a  pet Quokka")
    seed(memory, "ada", [first], working_memory="Ada: ADA KEEPS A PET QUOKKA. She plays cello.")
    current = make_fact("ada", "Ada keeps a pet quokka")
    assert current.fact_id == first.fact_id  # the same fact, written again
    quoting = make_fact("ada", 'Since May, ada keeps a pet\nquokka (a "rescue")')
    seed(memory, "ada", [current, quoting])
    event = make_event("ada", "I said: Ada keeps a PET quokka!", minutes=0)
    PostgresEventLog(migrated_pool, SubjectHasher(b"k" * 32)).append([(event, None)])

    log = PostgresErasureLog(migrated_pool)
    erasure_id = open_fact_erasure(log, ADA, current.fact_id)
    log.erase_fact(erasure_id, ADA, current.fact_id, {})

    assert find_in_tables(fresh_database, ["quokka"]) == {}
    # What is not the fact stays.
    assert rows(fresh_database, "SELECT working_memory FROM user_memory") == [
        ("Ada: [erased]. She plays cello.",)
    ]
    assert [f.content for f in memory.facts_by_id([quoting.fact_id])] == [
        'Since May, [erased] (a "rescue")'
    ]


@pytest.mark.parametrize(
    "text",
    [
        'Ada writes C++ (and .NET) at $work [often] a|b^c? {1} \\ "quoted" *end*',
        "tab\there, newline\nthere",
    ],
)
def test_the_pattern_finds_the_text_as_written_and_inside_json_and_nothing_else(
    migrated_pool: ConnectionPool, text: str
) -> None:
    json_form = json.dumps(text.upper())[1:-1]
    with migrated_pool.connection() as conn:
        found = conn.execute(
            "SELECT regexp_replace(%(w)s, _quote_pattern(%(t)s), '<>', 'gi'),"
            " regexp_replace(%(j)s, _quote_pattern(%(t)s), '<>', 'gi'),"
            " %(other)s ~* _quote_pattern(%(t)s)",
            {
                "t": text,
                "w": f"[{text.title()}]",
                "j": f"[{json_form}]",
                "other": text.replace("e", "a"),
            },
        ).fetchone()
    assert found == ("[<>]", "[<>]", False)


def test_a_fact_of_no_words_is_erased_and_nothing_else_is_touched(
    migrated_pool: ConnectionPool, fresh_database: str
) -> None:
    memory = PostgresMemoryStore(migrated_pool)
    blank = make_fact("ada", " \n ")  # no words: no pattern to find it by
    seed(memory, "ada", [blank, make_fact("ada", "Ada plays cello")], working_memory="Ada: cello.")
    log = PostgresErasureLog(migrated_pool)
    erasure_id = open_fact_erasure(log, ADA, blank.fact_id)
    log.erase_fact(erasure_id, ADA, blank.fact_id, {})
    assert rows(fresh_database, "SELECT working_memory FROM user_memory") == [("Ada: cello.",)]
    assert sorted(f.content for f in memory.facts(ADA)) == ["Ada plays cello"]
