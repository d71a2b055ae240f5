"""S's indented JSON in the prompt block: the text json.dumps gives, and no garbage cycles."""

from __future__ import annotations

import gc
import inspect
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from store.read.scaffold_json import indented_json

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(10**20, 10**30),
    st.floats(),  # NaN and infinities as json writes them
    st.text(),
)
keys = st.one_of(st.text(), st.integers(), st.floats(), st.booleans(), st.none())
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=30,
)


def _dumps(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


@given(json_values)
def test_the_text_is_what_json_dumps_writes(value: Any) -> None:
    assert indented_json(value) == _dumps(value)


@given(st.dictionaries(keys, scalars, max_size=4))
def test_keys_that_are_not_strings_are_written_as_json_writes_them(value: dict[Any, Any]) -> None:
    try:
        expected = _dumps(value)
    except TypeError:  # keys of mixed types cannot be sorted
        with pytest.raises(TypeError):
            indented_json(value)
    else:
        assert indented_json(value) == expected


def test_what_json_cannot_write_is_refused() -> None:
    with pytest.raises(TypeError):
        indented_json({"when": object()})
    with pytest.raises(TypeError):
        indented_json({(1, 2): "tuple key"})


def test_writing_a_scaffold_leaves_no_garbage_for_the_cyclic_collector() -> None:
    scaffold = {"Projects": {"Atlas": ["launch", {"due": "2026-03-01"}]}, "Tools": ["Vim", 3.5]}
    gc.collect()
    # Other threads of the test process (a test runner's I/O, earlier tests' clients winding
    # down) may leave garbage meanwhile: only the functions of a JSON encoder count. The cycles
    # json.dumps(indent=...) leaves are its encoder's closures referring to themselves.
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(50):
            indented_json(scaffold)
        gc.collect()
        encoders = [
            o
            for o in gc.garbage
            if inspect.isfunction(o) and o.__module__ in {"json.encoder", indented_json.__module__}
        ]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert encoders == []
