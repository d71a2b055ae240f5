"""The keyword stage's in-process BM25: scope masks, statistics over the scope, ties by row.

That it ranks exactly as the SQL BM25 is checked against Postgres in
`tests/integration/test_dense_search_paths.py`."""

from __future__ import annotations

import numpy as np

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
