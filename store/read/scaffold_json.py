"""S as indented JSON for the prompt block, without leaving garbage for the collector.

`json.dumps(..., indent=2)` cannot use the C encoder; its pure-Python one builds a knot of
closures that refer to each other and becomes a reference cycle when the call returns (about
25 objects a turn). Only the cyclic collector frees those, and it stops the whole API worker
while it runs: with one such knot a turn, bench.api at 16 clients logged collections of 5-26 ms
every 2-3 s and of 30-137 ms every 15 s in each worker. This writer gives the same text
(`tests/unit/test_scaffold_json.py` compares it with `json.dumps`) from a plain recursion and
the C encoder for the leaves.
"""

from __future__ import annotations

import json
from typing import Any

INDENT = "  "
# One-shot encodes of scalars take the C path and hold nothing afterwards.
_LEAF = json.JSONEncoder(ensure_ascii=False)


def indented_json(value: Any) -> str:
    """`json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)`."""
    return _encode(value, 0)


def _encode(value: Any, depth: int) -> str:
    if isinstance(value, dict):
        items = [f"{_key(k)}: {_encode(v, depth + 1)}" for k, v in sorted(value.items())]
        return _block("{", items, "}", depth)
    if isinstance(value, (list, tuple)):
        return _block("[", [_encode(v, depth + 1) for v in value], "]", depth)
    return _LEAF.encode(value)


def _block(opening: str, items: list[str], closing: str, depth: int) -> str:
    if not items:
        return opening + closing
    inner = "\n" + INDENT * (depth + 1)
    return opening + inner + ("," + inner).join(items) + "\n" + INDENT * depth + closing


def _key(key: Any) -> str:
    """A key as json writes it: strings as they are; numbers, booleans and None as their JSON
    text, quoted."""
    if isinstance(key, str):
        return _LEAF.encode(key)
    if key is None or isinstance(key, (bool, int, float)):
        return _LEAF.encode(_LEAF.encode(key))
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")
