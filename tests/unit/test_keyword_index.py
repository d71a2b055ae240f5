"""The keyword stage's in-process BM25: scope masks, statistics over the scope, ties by row.

That it ranks exactly as the SQL BM25 is checked against Postgres in
`tests/integration/test_dense_search_paths.py`."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from store.read.keyword_index import KeywordIndex, QueryLexemes, Terms

ROWS = [
    Terms(("bee", "roof"), (1, 1)),  # 0
    Terms(("bee",), (3,)),  # 1
    Terms(("chess", "roof"), (1, 1)),  # 2
    Terms(("bee", "roof"), (1, 1)),  # 3: the same text as row 0
    Terms((), ()),  # 4: only stop words
]
ALL = np.ones(len(ROWS), dtype=np.bool_)


def test_only_facts_sharing_a_lexeme_come_back_best_first_ties_by_row() -> None:
    index = KeywordIndex(ROWS)
    assert index.search(["bee", "roof"], ALL, 10) == [0, 3, 1, 2]
    assert index.search(["volcano"], ALL, 10) == []
    assert index.search([], ALL, 10) == []


def test_limit_and_mask_cut_the_answer() -> None:
    index = KeywordIndex(ROWS)
    assert index.search(["bee", "roof"], ALL, 2) == [0, 3]
    assert index.search(["bee", "roof"], ALL, 0) == []
    visible = np.array([False, True, True, False, False])
    assert index.search(["bee", "roof"], visible, 10) == [1, 2]
    assert index.search(["bee"], np.zeros(len(ROWS), dtype=np.bool_), 10) == []


def test_document_frequencies_are_those_of_the_scope() -> None:
    """'roof' is in three facts of the memory but one of the scope: there it is the rarer
    word, so the fact with it outranks the one with a more frequent 'bee'."""
    index = KeywordIndex(ROWS)
    visible = np.array([True, True, False, False, True])
    assert index.search(["roof", "bee"], visible, 10) == [0, 1]
    assert index.search(["roof"], visible, 10) == [0]


def test_query_lexemes_ask_postgres_once_per_text() -> None:
    asked: list[str] = []

    def source(text: str) -> list[str]:
        asked.append(text)
        return text.split()

    lexemes = QueryLexemes(source, max_texts=2)
    assert lexemes("bee roof") == ("bee", "roof")
    assert lexemes("bee roof") == ("bee", "roof")
    lexemes("chess")
    lexemes("piano")  # evicts "bee roof", the oldest
    lexemes("bee roof")
    assert asked == ["bee roof", "chess", "piano", "bee roof"]


_LEXEMES = ["bee", "roof", "chess", "honey", "tea", "cello"]
_TERMS = st.lists(
    st.tuples(st.sampled_from(_LEXEMES), st.integers(1, 3)), max_size=4, unique_by=lambda t: t[0]
).map(lambda pairs: Terms(tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)))


@settings(max_examples=80, deadline=None)
@given(
    st.lists(_TERMS, max_size=8),
    st.lists(st.lists(st.tuples(st.integers(0, 1_000), _TERMS), max_size=4), max_size=5),
    st.integers(0, 2**16),
)
def test_rows_inserted_rank_as_an_index_built_with_them(
    first: list[Terms], rounds: list[list[tuple[int, Terms]]], seed: int
) -> None:
    """Rows inserted into an index, round after round, at any positions: every search ranks
    as the index built from all the rows in their final order."""
    rows = list(first)
    index = KeywordIndex(rows)
    for inserted in rounds:
        at = sorted(p % (len(rows) + 1) for p, _ in inserted)
        terms = [t for _, t in inserted]
        index = index.with_rows_inserted(at, terms)
        for offset, (position, term) in enumerate(zip(at, terms, strict=True)):
            rows.insert(position + offset, term)
    built = KeywordIndex(rows)
    assert len(index) == len(built) == len(rows)
    visible = np.random.default_rng(seed).random(len(rows)) < 0.7
    for query in (_LEXEMES[:2], _LEXEMES[2:], _LEXEMES, ["volcano"]):
        for mask in (np.ones(len(rows), dtype=np.bool_), visible):
            assert index.search(query, mask, 5) == built.search(query, mask, 5)
