"""The benches' requests: no question asked twice in a run, or the embedder's cache answers it."""

from __future__ import annotations

import random

from bench import synthetic_memory as synthetic
from bench.api import Bodies
from bench.candidates import requests_for
from bench.read_path import sample_requests


def test_requests_drawn_from_one_stream_never_repeat_a_question() -> None:
    questions = synthetic.chat_turns(random.Random(7))
    first = sample_requests(["ada", "bob"], 2_000, 7, questions)
    second = sample_requests(["cy"], 2_000, 7, questions)  # the next tier, same seed
    asked = [query for _, _, query in first + second]
    assert len(set(asked)) == len(asked) == 4_000


def test_request_bodies_are_handed_out_once_then_counted_as_repeats() -> None:
    bodies = Bodies([b"a", b"b", b"c"])
    assert [bodies.take() for _ in range(3)] == [b"a", b"b", b"c"]
    assert bodies.repeated == 0
    assert [bodies.take() for _ in range(2)] == [b"a", b"b"]
    assert bodies.repeated == 2


def test_the_candidate_searches_requests_share_users_but_not_texts() -> None:
    turns = synthetic.chat_turns(random.Random(7))
    entries = requests_for(["ada", "bob", "cy"], 50, 5, 7, turns)
    sql = requests_for(["ada", "bob", "cy"], 50, 5, 7, turns)  # the other search, same tier
    assert [(k, [q.connection_id for q in qs]) for k, qs in entries] == [
        (k, [q.connection_id for q in qs]) for k, qs in sql
    ]
    texts = [q.text for _, qs in entries + sql for q in qs]
    assert len(set(texts)) == len(texts) == 500
