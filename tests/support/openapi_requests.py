"""Hypothesis strategies of HTTP requests drawn from the API's OpenAPI document: every
operation, with parameters and bodies that follow their schemas or break them anywhere."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from hypothesis import strategies as st

from consumers.decoding import MAX_EXCERPT_CHARS

MAX_ITEMS = 4
MAX_TEXT = 60
# The leaves a broken request puts anywhere: wrong types, NUL, long text, bad numbers.
long_texts = st.text("QXZJVK", min_size=MAX_EXCERPT_CHARS + 1, max_size=400).map(lambda s: s * 3)
nasty = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(10**30, 10**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=MAX_TEXT),
    st.text(max_size=MAX_TEXT).map(lambda s: f"{s}\x00{s}"),
    long_texts,
    st.lists(st.integers(), max_size=2),
    st.dictionaries(long_texts, st.integers(), max_size=1),
)


@dataclass(frozen=True)
class ApiRequest:
    method: str
    path: str
    params: dict[str, Any] = field(default_factory=dict)
    body: bytes | None = None
    inputs: tuple[str, ...] = ()  # every string the request carries, to look for echoes

    def describe(self) -> str:
        return f"{self.method} {self.path} {self.params} {self.body[:200] if self.body else b''!r}"


def _resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        *_, name = schema["$ref"].split("/")
        schema = {
            **doc["components"]["schemas"][name],
            **{k: v for k, v in schema.items() if k != "$ref"},
        }
    return schema


def values(doc: dict[str, Any], schema: dict[str, Any], broken: bool) -> st.SearchStrategy[Any]:
    """Values that follow `schema`; when `broken`, any node may be a nasty value instead."""
    follows = _follows(doc, _resolve(doc, schema), broken)
    return st.one_of(follows, nasty) if broken else follows


def _follows(doc: dict[str, Any], s: dict[str, Any], broken: bool) -> st.SearchStrategy[Any]:
    if "anyOf" in s:
        return st.one_of([values(doc, option, broken) for option in s["anyOf"]])
    if "enum" in s:
        return st.sampled_from(s["enum"])
    if "const" in s:
        return st.just(s["const"])
    kind = s.get("type")
    if kind == "string":
        return _strings(s)
    if kind == "integer":
        return st.integers(s.get("minimum", -(2**31)), s.get("maximum", 2**31))
    if kind == "number":
        return st.floats(allow_nan=False, allow_infinity=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        items = values(doc, s.get("items", {}), broken)
        return st.lists(items, max_size=min(s.get("maxItems", MAX_ITEMS), MAX_ITEMS))
    if kind == "object":
        return _objects(doc, s, broken)
    return nasty


def _strings(s: dict[str, Any]) -> st.SearchStrategy[str]:
    low, high = s.get("minLength", 0), min(s.get("maxLength", MAX_TEXT), MAX_TEXT)
    fmt = s.get("format")
    if fmt == "uuid":
        return st.uuids().map(str)
    if fmt == "date-time":
        return st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat())
    if "pattern" in s:
        return st.from_regex(s["pattern"], fullmatch=True).filter(lambda t: low <= len(t) <= high)
    return st.text(min_size=low, max_size=max(low, high))


@st.composite
def _objects(draw: st.DrawFn, doc: dict[str, Any], s: dict[str, Any], broken: bool) -> Any:
    required = set(s.get("required", ()))
    out = {}
    for name, sub in s.get("properties", {}).items():
        keep = name in required or draw(st.booleans())
        if broken and draw(st.integers(0, 9)) == 0:
            keep = not keep  # a required key missing, or an optional one given
        if keep:
            out[name] = draw(values(doc, sub, broken))
    if broken and draw(st.integers(0, 9)) == 0:
        out[draw(st.text(max_size=MAX_TEXT) | long_texts)] = draw(nasty)
    return out


def _strings_of(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *_strings_of(v)]]
    if isinstance(value, list):
        return [s for v in value for s in _strings_of(v)]
    return []


@st.composite
def requests(draw: st.DrawFn, doc: dict[str, Any], broken: bool = True) -> ApiRequest:
    """A request to any operation of `doc`: parameters and body from their schemas, each
    part broken now and then (bodies also as bytes that are not JSON)."""
    operations = [
        (m, p, op) for p, ops in sorted(doc["paths"].items()) for m, op in sorted(ops.items())
    ]
    method, template, op = draw(st.sampled_from(operations))
    path, params, inputs = template, {}, []
    for parameter in op.get("parameters", ()):
        if parameter["in"] == "query" and not parameter.get("required") and draw(st.booleans()):
            continue
        value = draw(values(doc, parameter["schema"], broken))
        if value is None:
            continue
        inputs += _strings_of(value)
        if parameter["in"] == "path":
            path = path.replace(f"{{{parameter['name']}}}", quote(str(value), safe=""))
        else:
            params[parameter["name"]] = value if isinstance(value, list) else str(value)
    body = None
    if "requestBody" in op:
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        if broken and draw(st.integers(0, 9)) == 0:
            body = draw(st.binary(max_size=100) | long_texts.map(str.encode))
            inputs.append(body.decode(errors="replace"))
        else:
            payload = draw(values(doc, schema, broken))
            inputs += _strings_of(payload)
            body = json.dumps(payload).encode()
    return ApiRequest(method.upper(), path, params, body, tuple(inputs))


def echoed(request: ApiRequest, answer: str) -> str | None:
    """A piece of the request longer than an excerpt that the answer repeats, if any."""
    window = MAX_EXCERPT_CHARS + 1
    for text in request.inputs:
        for start in range(len(text) - window + 1):
            if text[start : start + window] in answer:
                return text[start : start + window]
    return None
