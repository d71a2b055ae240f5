"""The credit ledger books exactly what the runs used, once, whatever is redelivered.

LLM entries: one per succeeded run, units = prompt + completion tokens, cost from the price
table. Embedding entries: units = fact versions written to the index. A redelivered batch (a
new consumer group reading everything again, or a processor SIGKILLed after its transaction
but before indexing and committing offsets) books nothing more.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from domain.model import TokenUsage
from memoryd import wiring
from memoryd.jobs import drain_index_once
from processors.cost import PriceTable
from producers.contract import EventType
from tests.support.builders import make_event
from tests.support.deployment import Deployment, gemini_backend
from tests.support.fake_gemini import FakeGemini, FakeReply

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake() -> Iterator[FakeGemini]:
    with FakeGemini() as server:
        yield server


def answer(user: str) -> dict[str, Any]:
    return {
        "updated_working_memory": f"{user} works on Falcon.",
        "updated_scaffold": {"Projects": ["Falcon"]},
        "facts": [
            {"op": "add", "content": f"{user} works on the Falcon project.", "type": "lore",
             "confidence": 0.9, "salience": 0.6, "surface": "speak", "evidence": ["E1"]},
            {"op": "add", "content": f"{user} prefers async standups.", "type": "preference",
             "confidence": 0.8, "salience": 0.5, "surface": "adapt", "evidence": ["E2"]},
        ],
    }  # fmt: skip


def ledger(deployment: Deployment) -> list[tuple[Any, ...]]:
    return deployment.query(
        "SELECT entry_id, run_id, operation, model, units, cost_micro_usd FROM credit_ledger"
        " ORDER BY entry_id"
    )


def assert_ledger_matches_runs(deployment: Deployment) -> None:
    prices = PriceTable(deployment.settings.prices)
    runs = deployment.query(
        "SELECT run_id, model, prompt_tokens, completion_tokens, cost_micro_usd"
        " FROM consolidation_runs WHERE status = 'succeeded'"
    )
    entries = [r for r in ledger(deployment) if r[2] == "llm"]
    per_run = Counter(r[1] for r in entries)
    assert per_run == Counter(r[0] for r in runs), "one llm entry per succeeded run, no other"
    llm = {r[1]: r for r in entries}
    for run_id, model, prompt, completion, run_cost in runs:
        _, _, _, entry_model, units, cost = llm[run_id]
        expected = prices.llm_cost_micro_usd(model, TokenUsage(prompt, completion))
        assert (entry_model, units, cost, run_cost) == (model, prompt + completion, expected,
                                                        expected)  # fmt: skip
    assert sum(r[4] for r in llm.values()) == sum(r[2] + r[3] for r in runs)

    # Every fact version was indexed once and booked once: a fact's version counts the
    # writes it has had, and each write has its history row.
    [(versions, history, pending)] = deployment.query(
        "SELECT sum(version), (SELECT count(*) FROM fact_history),"
        " count(*) FILTER (WHERE indexed_at IS NULL) FROM memory_facts"
    )
    embedded = sum(r[4] for r in ledger(deployment) if r[2] == "embedding")
    assert pending == 0
    assert embedded == versions == history


def test_the_ledger_books_exactly_the_tokens_and_fact_versions_used(
    deployment: Deployment, fake: FakeGemini
) -> None:
    users = ["ada", "bo", "cy"]
    fake.reply(
        FakeReply.json(answer("ada"), prompt_tokens=1_234, completion_tokens=321),
        FakeReply.json(answer("bo"), prompt_tokens=777, completion_tokens=99, thoughts_tokens=50),
        FakeReply.json(answer("cy"), prompt_tokens=5, completion_tokens=1),
    )
    deployment.publish(
        [make_event(u, f"I work on Falcon ({u})", minutes=0) for u in users]
        + [make_event(u, "I like async standups", EventType.PREFERENCE, minutes=1)
           for u in users]
    )  # fmt: skip
    with gemini_backend(fake.url) as backend:
        deployment.run_processor(backend)
    # A second round changes stored facts (new versions): the offline backend contradicts.
    deployment.publish(
        [make_event("ada", "Actually I no longer work on Falcon", EventType.CORRECTION,
                    minutes=60)]
    )  # fmt: skip
    deployment.run_processor()

    assert [r[0] for r in deployment.query("SELECT status FROM consolidation_runs")] == [
        "succeeded"
    ] * 4
    [(total_llm_cost,)] = deployment.query(
        "SELECT sum(cost_micro_usd) FROM credit_ledger WHERE operation = 'llm'"
    )
    # gemini-2.5-flash list prices: $0.30 in, $2.50 out (thinking billed as output) per Mtok.
    assert total_llm_cost == sum(
        -(-(p * 30 + c * 250) // 100) for p, c in [(1_234, 321), (777, 149), (5, 1)]
    )
    assert deployment.query("SELECT max(version) FROM memory_facts") == [(2,)]
    assert_ledger_matches_runs(deployment)


def test_reading_everything_again_books_nothing_twice(deployment: Deployment) -> None:
    deployment.publish(
        [make_event("ada", "I work on the Falcon project", minutes=0),
         make_event("bo", "I live in Lisbon", minutes=0)]
    )  # fmt: skip
    deployment.run_processor()
    before = ledger(deployment)
    assert before

    # A consumer group that never committed anything reads every record again.
    kafka = deployment.settings.kafka.model_copy(
        update={"processor_group": f"again-{uuid.uuid4()}"}
    )
    again = Deployment(deployment.settings.model_copy(update={"kafka": kafka}), deployment.dsn)
    again.run_processor()

    assert ledger(deployment) == before
    assert len(deployment.query("SELECT run_id FROM consolidation_runs")) == 2
    assert_ledger_matches_runs(deployment)


# The child consolidates and dies by SIGKILL the moment its run's transaction has committed:
# memory written, facts not indexed, offsets not committed, nothing cleaned up.
_KILLED_CHILD = textwrap.dedent(
    """
    import dataclasses, os, signal, sys
    from memoryd import wiring
    from memoryd.settings import Settings

    class DiesAfterCommit:
        def __init__(self, inner):
            self._inner = inner
        def apply(self, update):
            self._inner.apply(update)
            os.kill(os.getpid(), signal.SIGKILL)
        def __getattr__(self, name):
            return getattr(self._inner, name)

    settings = Settings.model_validate_json(sys.argv[1])
    with wiring.core(settings) as c:
        c = dataclasses.replace(c, memory=DiesAfterCommit(c.memory))
        wiring.processor(c).run_until_idle(idle_s=30)
    sys.exit(3)  # not reached: the first apply kills the process
    """
)


def test_a_processor_killed_mid_run_books_nothing_twice(deployment: Deployment) -> None:
    events = [
        make_event("ada", "I work on the Falcon project", minutes=0),
        make_event("ada", "I prefer async standups", EventType.PREFERENCE, minutes=1),
    ]
    deployment.publish(events)
    child = subprocess.run(
        [sys.executable, "-c", _KILLED_CHILD, deployment.settings.model_dump_json()],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == -9, child.stderr.decode()[-2_000:]
    assert deployment.query("SELECT status FROM consolidation_runs") == [("succeeded",)]
    [(pending,)] = deployment.query("SELECT count(*) FROM memory_facts WHERE indexed_at IS NULL")
    assert pending > 0
    before = [r for r in ledger(deployment) if r[2] == "llm"]

    # The same group: the uncommitted records come back to the next processor.
    def redeliver(c: wiring.Core) -> float:
        wiring.processor(c).run_until_idle(idle_s=2.0)
        again = c.registry.get_sample_value("memoryd_flushes_total", {"outcome": "nothing_new"})
        return again or 0.0

    assert deployment.with_core(redeliver) >= 1
    assert [r for r in ledger(deployment) if r[2] == "llm"] == before
    assert deployment.query("SELECT status FROM consolidation_runs") == [("succeeded",)]
    assert deployment.with_core(drain_index_once) == pending
    assert deployment.with_core(drain_index_once) == 0
    assert_ledger_matches_runs(deployment)
