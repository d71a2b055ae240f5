"""Recursive JSON normalization of LLM output.

Models asked for structured output still return nested objects as JSON strings (sometimes
encoded twice, sometimes wrapped in Markdown fences). `normalize_json` turns those strings back
into the objects they hold, and nothing else: a string is decoded only when it holds a JSON
object or array, so "42", "true" or "null" written as text stay text.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from producers.contract import json_leaves

DEFAULT_MAX_DEPTH = 8

# A whole document inside one Markdown code fence, with an optional language tag.
_FENCED = re.compile(r"\A```[A-Za-z0-9_+-]*[ \t]*\n?(?P<body>.*?)\n?[ \t]*```\Z", re.DOTALL)


def strip_fences(text: str) -> str:
    """The document inside a ``` fence that wraps all of `text`; otherwise `text` unchanged."""
    match = _FENCED.match(text.strip())
    return match.group("body").strip() if match else text


def normalize_json(value: Any, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """Decode, at every level down to `max_depth`, the strings that hold JSON objects or arrays.

    Depth counts container nesting in the result, not decoding steps, so a string encoded twice
    costs no more depth than one encoded once and the function is idempotent.
    """
    if max_depth <= 0:
        return value
    if isinstance(value, str):
        decoded = _decode_container(value)
        if decoded is None:
            return value
        value = decoded
    if isinstance(value, dict):
        return {key: normalize_json(item, max_depth - 1) for key, item in value.items()}
    if isinstance(value, list):
        return [normalize_json(item, max_depth - 1) for item in value]
    return value


def merge_json(old: Any, new: Any) -> Any:
    """`new` written over `old` the way a `scaffold_update` writes its key: objects key by key,
    recursively, so an update naming some of an object's keys keeps the others; any other
    value replaces what was there. Idempotent: merging the same `new` twice changes nothing."""
    if isinstance(old, dict) and isinstance(new, dict):
        return {**old, **{k: merge_json(old.get(k), v) for k, v in new.items()}}
    return new


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """`patch` applied to `target` as a JSON Merge Patch (RFC 7386): objects key by key,
    recursively, a null removing its key, any other value replacing what was there. So an
    answer names only what changes, and a key it leaves out is kept."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


def merge_patch_between(before: Any, after: Any) -> Any:
    """The smallest merge patch that turns `before` into `after` (`apply_merge_patch`).

    A null inside `after` cannot be told from a removal: such a key is removed, which for a
    profile value that holds nothing loses nothing."""
    if not (isinstance(before, dict) and isinstance(after, dict)):
        return after
    patch: dict[str, Any] = {key: None for key in before if key not in after}
    for key, value in after.items():
        if key not in before:
            patch[key] = value
        elif before[key] != value:
            patch[key] = merge_patch_between(before[key], value)
    return patch


def _decode_container(text: str) -> dict[str, Any] | list[Any] | None:
    """The object or array `text` encodes, through any number of string encodings; else None."""
    current: Any = text
    # Each decoding step strictly shortens the text, so this loop ends.
    while isinstance(current, str):
        candidate = strip_fences(current).strip()
        if not candidate or candidate[0] not in '{["' or candidate[-1] not in '}]"':
            return None
        try:
            current = json.loads(candidate)
        except json.JSONDecodeError:
            return None
    return current if isinstance(current, dict | list) else None


def storable_json(value: Any) -> Any:
    """`value` as Postgres can hold it in text and jsonb: NUL and lone surrogates (which no
    UTF-8 encodes) become U+FFFD, a number that is not finite (NaN, Infinity) becomes null.

    Python's JSON parser takes all of them and a model can answer with any; one left in a
    memory failed the write of its whole batch. Unchanged values come back as they are.
    """
    if not _unstorable(value):
        return value
    return _storable(value)


_UNSTORABLE_CHARS = re.compile("[\x00\ud800-\udfff]")


def _unstorable(value: Any) -> bool:
    return any(
        (isinstance(x, str) and _UNSTORABLE_CHARS.search(x) is not None)
        or (isinstance(x, float) and not math.isfinite(x))
        for x in json_leaves(value)
    )


def _storable(value: Any) -> Any:
    if isinstance(value, str):
        return _UNSTORABLE_CHARS.sub("\ufffd", value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {_storable(k): _storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_storable(item) for item in value]
    return value


def truncate_text(text: str, max_chars: int, max_words: int | None = None) -> str:
    """`text` cut to at most `max_chars` characters (and `max_words` words), at a word boundary.

    Whitespace inside the kept part is preserved so a narrative keeps its paragraphs.
    """
    words = list(re.finditer(r"\S+", text))
    end = len(text)
    if max_words is not None and len(words) > max_words:
        end = words[max_words - 1].end() if max_words > 0 else 0
    if end > max_chars:
        fitting = [w for w in words if w.end() <= max_chars]
        # One "word" longer than the cap (a URL, a blob) is cut mid-word rather than dropped.
        end = fitting[-1].end() if fitting else max_chars
    return text[:end].rstrip() if end < len(text) else text


# Where a sentence ends: its punctuation (and a closing quote or bracket) before a space, or a
# line break, which ends a paragraph or a list item that has no full stop.
_SENTENCE_END = re.compile(r"[.!?…][\"'”’)\]]*(?=\s)|(?=\n)")


def truncate_at_sentence(text: str, max_chars: int, max_words: int | None = None) -> str:
    """`truncate_text`, backed off to the last sentence end inside what it keeps when there is
    one, so that a narrative cut at its cap ends on a whole sentence; else cut at a word."""
    cut = truncate_text(text, max_chars, max_words)
    if cut == text:
        return text
    # The character after the cut decides whether a final full stop ends a sentence.
    probe = text[: len(cut) + 1]
    ends = [m.end() for m in _SENTENCE_END.finditer(probe) if 0 < m.end() <= len(cut)]
    return cut[: ends[-1]].rstrip() if ends else cut
