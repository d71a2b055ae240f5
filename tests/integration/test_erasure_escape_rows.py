"""A fact erasure matches a text with the fact's escapes only where a backslash in it may start
one (migration 0025), on real Postgres: it finds and writes exactly what matching every text
with the escapes (0024) does, with backslashes anywhere in the text or none."""

from __future__ import annotations

import json
import random
import uuid
from dataclasses import replace
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from domain.ids import SubjectHasher
from domain.model import RunStatus
from store.write.erasure_log import PostgresErasureLog
from store.write.event_log import PostgresEventLog
from store.write.memory_store import PostgresMemoryStore
from tests.support.builders import key_of, make_event, make_fact, make_run, seed
from tests.support.erasure import find_in_tables, open_fact_erasure, rows

pytestmark = pytest.mark.integration

ADA = key_of("ada")
# Latin-1, beyond it, beyond the BMP; Cyrillic with case variants; "ß", one unit of two letters.
FACTS = [
    "Renée moved to Zürich near the Ŧarn 🌲",
    "Ада держит квокку по имени Брамбл",
    "Ada lives on the Straße in Köln",
]


def _pieces(fact: str) -> list[str]:
    """What a text may hold of the fact, as written or escaped, cut, or next to backslashes."""
    json_form, repr_form = json.dumps(fact)[1:-1], ascii(fact)[1:-1]
    # Hex digits and "u", "x" in either case: the erasure matches with the 'i' flag.
    escaped = [json_form, repr_form, json.dumps(fact.upper())[1:-1], repr_form.upper()]
    cut = [fact[:14] + "...", "..." + fact[-14:], escaped[0][:20]]
    words = [*fact.split(), *json.dumps(fact).strip('"').split()]
    others = [" ", "\n", "\\n", '\\"', "\\", "\\\\", "C:\\temp", "\\X", "é", "\\u00e9", "..."]
    return [fact, fact.upper(), fact.casefold(), *escaped, *cut, *words, *others]


def _texts(fact: str, n: int = 400) -> list[str]:
    rng = random.Random(fact)
    pieces = _pieces(fact)
    return ["".join(rng.choices(pieces, k=rng.randint(1, 8))) for _ in range(n)]


@pytest.mark.parametrize("fact", FACTS)
def test_a_text_is_matched_and_redacted_as_with_the_escapes_everywhere(
    migrated_pool: ConnectionPool, fact: str
) -> None:
    texts = _texts(fact)
    with migrated_pool.connection() as conn:
        found = conn.execute(
            "SELECT t, strpos(t, E'\\\\') > 0, _pattern_for(t, ARRAY['with', 'without']),"
            " _matches(t, ARRAY[e.quote, p.quote]), t ~* e.quote,"
            " _redact_matching(t, ARRAY[e.quote, p.quote]),"
            " regexp_replace(t, e.quote, '[erased]', 'gi'),"
            " _redact_matching(t, ARRAY[e.error, p.error]),"
            " regexp_replace(t, e.error, '[erased]', 'gi')"
            " FROM unnest(%s::text[]) AS t,"
            " _fact_patterns(gen_random_uuid(), %s, true) AS e,"
            " _fact_patterns(gen_random_uuid(), %s, false) AS p",
            (texts, fact, fact),
        ).fetchall()
    for text, _, _, matches, escaped_matches, quote, escaped_quote, error, escaped_error in found:
        assert (matches, quote, error) == (escaped_matches, escaped_quote, escaped_error), text
    # The fact found with the escapes, and without them in texts with a backslash and without.
    found_by = {(slash, picked) for _, slash, picked, matches, *_ in found if matches}
    assert found_by == {(True, "with"), (True, "without"), (False, "without")}
    assert any("\\u" in text and "\\u" not in quote for text, _, _, _, _, quote, *_ in found)


def _erase(pool: ConnectionPool, fact_id: uuid.UUID) -> dict[str, Any]:
    log = PostgresErasureLog(pool)
    return log.erase_fact(open_fact_erasure(log, ADA, fact_id), ADA, fact_id, {})


def test_the_escaped_fact_next_to_a_backslash_and_the_plain_one_without_are_erased(
    migrated_pool: ConnectionPool, fresh_database: str
) -> None:
    fact = FACTS[0]
    memory = PostgresMemoryStore(migrated_pool)
    erased = make_fact("ada", fact)
    quoting = make_fact("ada", f"Bob heard that {fact} last May")
    seed(
        memory,
        "ada",
        [erased, quoting],
        working_memory=f"Ada said: {fact}.",
        # A list of strings: one holding the fact escaped (a backslash), one the fact as is.
        learned_info=[json.dumps(fact), f"{fact}, Ada wrote"],
    )
    # A backslash elsewhere in the text: a Windows path; the fact as written, or escaped.
    events = [make_event("ada", f"saved to C:\\notes: {fact}", minutes=0)]
    PostgresEventLog(migrated_pool, SubjectHasher(b"k" * 32)).append([(e, None) for e in events])
    memory.record_run(
        replace(
            make_run("ada", seq=2, version=2, status=RunStatus.FAILED).run,
            raw_response=json.dumps({"file": "C:\\notes", "note": fact}),
            error=f"value refused at C:\\notes: {fact!a}",
        )
    )

    receipt = _erase(migrated_pool, erased.fact_id)

    assert rows(fresh_database, "SELECT working_memory FROM user_memory") == [
        ("Ada said: [erased].",)
    ]
    assert [f.content for f in memory.facts_by_id([quoting.fact_id])] == [
        "Bob heard that [erased] last May"
    ]
    assert rows(fresh_database, "SELECT persistent_learned_info FROM user_memory") == [
        (['"[erased]"', "[erased], Ada wrote"],)
    ]
    assert rows(fresh_database, "SELECT content FROM context_events") == [("[erased]",)]
    assert rows(
        fresh_database, "SELECT raw_response, error FROM consolidation_runs WHERE error IS NOT NULL"
    ) == [
        (
            '{"file": "C:\\\\notes", "note": "[erased]"}',
            "value refused at C:\\notes: '[erased]'",
        )
    ]
    assert receipt["redacted"]["memory_facts"] == 1
    escapes = ["ren\\u00e9e", "ren\\xe9e", "z\\u00fcrich", "\\u0166arn", "\\U0001f332"]
    assert find_in_tables(fresh_database, ["Renée", "Zürich", *escapes]) == {}
