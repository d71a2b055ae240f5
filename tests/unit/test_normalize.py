from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processors.consolidate import cap_words
from processors.llm.gemini import parse_output
from processors.normalize import (
    apply_merge_patch,
    merge_patch_between,
    normalize_json,
    storable_json,
    strip_fences,
    truncate_at_sentence,
    truncate_text,
)
from processors.schema import MAX_WORKING_MEMORY_WORDS


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param('{"a": 1}', {"a": 1}, id="object-string"),
        pytest.param("[1, 2]", [1, 2], id="array-string"),
        pytest.param(' \n{"a": 1}\n ', {"a": 1}, id="surrounding-whitespace"),
        pytest.param(json.dumps(json.dumps({"a": 1})), {"a": 1}, id="doubly-encoded"),
        pytest.param(json.dumps(json.dumps(json.dumps([1]))), [1], id="triply-encoded"),
        pytest.param({"s": '{"Role": "designer"}'}, {"s": {"Role": "designer"}}, id="nested"),
        pytest.param(
            {"facts": ['{"content": "x", "op": "add"}', {"content": "y"}]},
            {"facts": [{"content": "x", "op": "add"}, {"content": "y"}]},
            id="object-in-list",
        ),
        pytest.param(
            {"a": '{"b": "[\\"c\\"]"}'}, {"a": {"b": ["c"]}}, id="string-inside-decoded-string"
        ),
        pytest.param('```json\n{"a": 1}\n```', {"a": 1}, id="fenced-string"),
        pytest.param("42", "42", id="number-text-stays"),
        pytest.param("true", "true", id="bool-text-stays"),
        pytest.param("null", "null", id="null-text-stays"),
        pytest.param('"quoted"', '"quoted"', id="json-string-literal-stays"),
        pytest.param(json.dumps("42"), json.dumps("42"), id="encoded-number-text-stays"),
        pytest.param("{not json}", "{not json}", id="braces-not-json"),
        pytest.param("[1, 2", "[1, 2", id="truncated-array"),
        pytest.param("plain text", "plain text", id="plain"),
        pytest.param("", "", id="empty"),
        pytest.param(3.5, 3.5, id="float"),
        pytest.param(None, None, id="null"),
        pytest.param({'{"k": 1}': "v"}, {'{"k": 1}': "v"}, id="keys-never-decoded"),
    ],
)
def test_normalize_json(value: Any, expected: Any) -> None:
    assert normalize_json(value) == expected


def _nest(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = json.dumps({"k": value})
    return value


@pytest.mark.parametrize(
    ("max_depth", "expected"),
    [
        pytest.param(0, _nest(3), id="depth-0-untouched"),
        pytest.param(1, {"k": _nest(2)}, id="depth-1"),
        pytest.param(2, {"k": {"k": _nest(1)}}, id="depth-2"),
        pytest.param(8, {"k": {"k": {"k": "leaf"}}}, id="depth-8-all"),
    ],
)
def test_depth_is_bounded(max_depth: int, expected: Any) -> None:
    assert normalize_json(_nest(3), max_depth=max_depth) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param('```json\n{"a": 1}\n```', '{"a": 1}', id="json-tag"),
        pytest.param('```JSON\n{"a": 1}\n```\n', '{"a": 1}', id="upper-tag-trailing-newline"),
        pytest.param("```\n[1]\n```", "[1]", id="no-tag"),
        pytest.param('  ```json {"a": 1} ```  ', '{"a": 1}', id="one-line"),
        pytest.param('{"a": "```x```"}', '{"a": "```x```"}', id="fence-inside-is-content"),
        pytest.param("Here:\n```json\n{}\n```", "Here:\n```json\n{}\n```", id="prose-before"),
        pytest.param('```json\n{"a": 1', '```json\n{"a": 1', id="unclosed-left-alone"),
        pytest.param('{"a": 1}', '{"a": 1}', id="unfenced"),
    ],
)
def test_strip_fences(text: str, expected: str) -> None:
    assert strip_fences(text) == expected


@pytest.mark.parametrize(
    ("text", "max_chars", "max_words", "expected"),
    [
        pytest.param("one two three", 100, None, "one two three", id="fits"),
        pytest.param("one two three", 100, 2, "one two", id="word-cap"),
        pytest.param("one two three", 9, None, "one two", id="char-cap-at-boundary"),
        pytest.param("one\n\ntwo three", 100, 2, "one\n\ntwo", id="keeps-paragraphs"),
        pytest.param("abcdefghij", 4, None, "abcd", id="single-long-word-cut"),
        pytest.param("", 10, 3, "", id="empty"),
    ],
)
def test_truncate_text(text: str, max_chars: int, max_words: int | None, expected: str) -> None:
    assert truncate_text(text, max_chars, max_words) == expected


@pytest.mark.parametrize(
    ("text", "max_words", "expected"),
    [
        pytest.param("One two. Three four five", 4, "One two.", id="back-to-the-full-stop"),
        pytest.param("Yes! Go now. Then more", 4, "Yes! Go now.", id="last-of-several"),
        pytest.param('She said "go." Then we left', 5, 'She said "go."', id="closing-quote"),
        pytest.param("First line\nsecond line goes on", 4, "First line", id="line-break"),
        pytest.param("It costs 3.50 and more", 3, "It costs 3.50", id="no-sentence-end"),
        pytest.param("one two three", 2, "one two", id="word-cut-without-sentences"),
        pytest.param("One two. Three", 3, "One two. Three", id="fits"),
        pytest.param("One two. Three four", 2, "One two.", id="cap-right-after-the-stop"),
    ],
)
def test_truncate_at_sentence(text: str, max_words: int, expected: str) -> None:
    assert truncate_at_sentence(text, 100, max_words) == expected
    assert truncate_at_sentence(text, len(expected), None) == expected


def test_working_memory_is_capped_after_its_last_whole_sentence() -> None:
    narrative = " ".join(f"Sentence {i} has exactly seven words here." for i in range(100))
    capped = cap_words(narrative)
    assert len(capped.split()) == 7 * (MAX_WORKING_MEMORY_WORDS // 7)
    assert capped.endswith("Sentence 70 has exactly seven words here.")
    assert narrative.startswith(capped)
    answer = parse_output(json.dumps({"updated_working_memory": narrative}))
    assert answer.updated_working_memory == capped


# Strings that normalize_json leaves alone: these are the leaves of the round-trip property.
_plain_text = st.text(max_size=20).filter(lambda s: normalize_json(s) == s)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | _plain_text
)
_json_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _stringify_nested(value: Any, top: bool = True) -> Any:
    """Every container below the top one replaced by its JSON text, as a sloppy LLM would."""
    if isinstance(value, dict):
        inner: Any = {k: _stringify_nested(v, top=False) for k, v in value.items()}
    elif isinstance(value, list):
        inner = [_stringify_nested(v, top=False) for v in value]
    else:
        return value
    return inner if top else json.dumps(inner)


@given(_json_values)
def test_round_trip_when_nested_containers_are_stringified(value: Any) -> None:
    depth = _depth(value) + 1
    assert normalize_json(_stringify_nested(value), max_depth=depth) == value


@given(_json_values | _json_values.map(lambda v: _stringify_nested(v, top=False)))
def test_idempotent(value: Any) -> None:
    once = normalize_json(value, max_depth=3)
    assert normalize_json(once, max_depth=3) == once


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("a\x00b", "a\ufffdb", id="nul"),
        pytest.param({"k\x00": "\udc00"}, {"k\ufffd": "\ufffd"}, id="key-and-lone-surrogate"),
        pytest.param([float("nan"), float("-inf"), 1.5], [None, None, 1.5], id="not-finite"),
        pytest.param({"a": [{"b": ("x\x00",)}]}, {"a": [{"b": ["x\ufffd"]}]}, id="deep"),
        pytest.param("\U0001f600 caf\u00e9", "\U0001f600 caf\u00e9", id="characters-stay"),
    ],
)
def test_storable_json_replaces_what_postgres_refuses(value: Any, expected: Any) -> None:
    assert storable_json(value) == expected
    json.dumps(storable_json(value), allow_nan=False).encode("utf-8")  # jsonb's rules


def test_storable_json_returns_a_storable_value_itself() -> None:
    value = {"a": [1, "x", {"b": 2.5}]}
    assert storable_json(value) is value


@pytest.mark.parametrize(
    ("target", "patch", "result"),
    [
        # RFC 7386's own examples.
        ({"a": "b"}, {"a": "c"}, {"a": "c"}),
        ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
        ({"a": "b"}, {"a": None}, {}),
        ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
        ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
        ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
        ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
        ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
        ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
        ("foo", {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
    ],
)
def test_a_merge_patch_applies_as_rfc_7386_says(target: Any, patch: Any, result: Any) -> None:
    assert apply_merge_patch(target, patch) == result


_NO_NULLS = st.recursive(
    st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)


@given(
    before=st.dictionaries(st.text(max_size=3), _NO_NULLS, max_size=4),
    after=st.dictionaries(st.text(max_size=3), _NO_NULLS, max_size=4),
)
def test_the_patch_between_two_objects_turns_one_into_the_other(
    before: dict[str, Any], after: dict[str, Any]
) -> None:
    patch = merge_patch_between(before, after)
    assert apply_merge_patch(before, patch) == after
    assert merge_patch_between(after, after) == {}
