"""Which of a run's gate decisions `memoryd explain` shows in a fact's chain."""

from __future__ import annotations

from dataclasses import replace

from domain.ids import MemoryKey, fact_id_for
from memoryd.analyst.explain import _gate_verdicts
from tests.support.builders import make_fact, make_run

TEXT = "Ada reviews the Acme contract on Fridays."


def test_a_decision_about_another_fact_of_the_same_words_is_not_this_one_s() -> None:
    plain = make_fact("ada", TEXT)
    scoped = replace(plain, fact_id=fact_id_for(MemoryKey("org-a", "ada"), TEXT, "inbox-1"))
    decisions = [
        {"op": "add", "content": TEXT, "verdict": "allow", "fact_id": str(scoped.fact_id)},
        {"op": "add", "content": TEXT, "verdict": "discard", "fact_id": None},
        {"op": "add", "content": TEXT, "verdict": "allow", "fact_id": str(plain.fact_id)},
    ]
    run = make_run("ada", seq=1, version=1)
    run = replace(run, run=replace(run.run, output={"gate_decisions": decisions}))
    assert [d["verdict"] for d in _gate_verdicts(run, plain)] == ["discard", "allow"]
    assert [d["verdict"] for d in _gate_verdicts(run, scoped)] == ["allow", "discard"]
