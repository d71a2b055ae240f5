"""A read's costs in the ledger: the query embedding once per turn, each query rewrite call."""

from __future__ import annotations

import math
import threading
import uuid

import pytest
from pydantic import SecretStr

from domain.errors import QueryRewriteFailed
from domain.ids import MemoryKey
from domain.model import TokenUsage
from memoryd import wiring
from store.embeddings import MODEL_NAME
from store.read.background import BatchWriter
from store.read.context_service import ContextService
from store.read.injection import InjectionCache
from store.read.query_rewrite import RewriteAnswer, TimeBoundRewriter
from store.read.read_ledger import ReadLedger
from tests.support.builders import make_fact
from tests.support.deployment import Deployment, seed_core
from tests.support.fake_gemini import FakeGemini, FakeReply, fake_gemini  # noqa: F401
from tests.support.ops import wait_for

pytestmark = pytest.mark.integration
ADA = MemoryKey("org-a", "ada")


def seeded_service(c: wiring.Core, rewriter: TimeBoundRewriter) -> ContextService:
    """The read path over a memory of one fact, its costs booked to the ledger."""
    seed_core(c, "ada", [make_fact("ada", "Ada takes her coffee black")], org="org-a")
    reads = wiring.read_model(c)
    return ContextService(
        reads,
        c.index,
        c.clock,
        cache=InjectionCache(reads),
        rewriter=rewriter,
        charges=wiring.read_charges(c),
        ledger=BatchWriter("read-costs", ReadLedger(c.pool, c.subjects).write),
    )


def test_query_embedding_is_booked_once_per_turn_and_every_rewrite_call(
    deployment: Deployment,
) -> None:
    settings = deployment.settings
    deployment.settings = settings.model_copy(
        update={"read_path": settings.read_path.model_copy(update={"rewrite": "gemini"})}
    )

    def check(c: wiring.Core) -> None:
        rewriter = TimeBoundRewriter(
            lambda q: ("coffee preferences of Ada", TokenUsage(40, 8)), timeout_s=5.0
        )
        service = seeded_service(c, rewriter)
        turn = uuid.uuid4()
        try:
            for _ in range(2):  # a client retrying the same turn
                service.assemble(ADA, "how does she take it?", log_id=turn)
            service.assemble(ADA, "and tea?")
        finally:
            service.close()
            rewriter.close()

    deployment.with_core(check)
    rows = deployment.query(
        "SELECT operation, model, units, organization_id FROM credit_ledger"
        " WHERE user_id = 'ada' AND run_id IS NULL ORDER BY operation, occurred_at"
    )
    embeddings = [r for r in rows if r[0] == "embedding"]
    rewrites = [r for r in rows if r[0] == "llm"]
    assert len(embeddings) == 2  # two turns, the retried one booked once
    assert {r[1] for r in embeddings} == {MODEL_NAME}
    # The retried turn called the rewriter again, and paid for it: three calls.
    assert rewrites == [("llm", "gemini-2.5-flash-lite", 48, "org-a")] * 3


def test_no_query_embedding_is_booked_when_nothing_was_scored(deployment: Deployment) -> None:
    # The dense search embeds the query only when something in the turn's scope has a vector.
    def check(c: wiring.Core) -> None:
        seed_core(
            c, "ada", [make_fact("ada", "Ada files invoices", connection_id="mail")], org="org-a"
        )
        reads = wiring.read_model(c)
        service = ContextService(
            reads,
            c.index,
            c.clock,
            cache=InjectionCache(reads),
            charges=wiring.read_charges(c),
            ledger=BatchWriter("read-costs", ReadLedger(c.pool, c.subjects).write),
        )
        try:
            service.assemble(ADA, "who files the invoices?")  # mail is not active
            service.assemble(MemoryKey("org-a", "nobody"), "who files the invoices?")
            service.assemble(ADA, "who files the invoices?", ["mail"])
        finally:
            service.close()

    deployment.with_core(check)
    rows = deployment.query(
        "SELECT user_id FROM credit_ledger WHERE run_id IS NULL AND operation = 'embedding'"
    )
    assert rows == [("ada",)]  # only the turn with the mail connection active scored a fact


def test_a_rewrite_call_not_used_is_booked_all_the_same(deployment: Deployment) -> None:
    # The turn stops waiting at its limit, or the model's answer has no usable text: either
    # way the call was billed, and its tokens are the user's.
    settings = deployment.settings
    deployment.settings = settings.model_copy(
        update={"read_path": settings.read_path.model_copy(update={"rewrite": "gemini"})}
    )
    answered = threading.Event()

    def rewrite(query: str) -> RewriteAnswer:
        if query.startswith("slow"):
            answered.wait(10)  # still running when the turn has gone on without it
            return "a rewrite too late", TokenUsage(30, 5)
        raise QueryRewriteFailed("gemini returned no text", TokenUsage(20, 64))

    def check(c: wiring.Core) -> None:
        rewriter = TimeBoundRewriter(rewrite, timeout_s=0.05)
        service = seeded_service(c, rewriter)
        try:
            slow = service.assemble(ADA, "slow: how does she take it?")
            assert slow.rewritten_query is None
            answered.set()
            failed = service.assemble(ADA, "and tea?")
            assert failed.rewritten_query is None
            # The late call's cost is queued when the call ends, after the turn answered.
            wait_for("both calls booked", lambda: len(booked(c)) == 2, 20)
        finally:
            service.close()
            rewriter.close()

    deployment.with_core(check)
    rows = deployment.query(
        "SELECT units FROM credit_ledger"
        " WHERE user_id = 'ada' AND run_id IS NULL AND operation = 'llm' ORDER BY units"
    )
    assert rows == [(35,), (84,)]


def test_a_rewrite_answered_after_the_turn_stopped_waiting_is_booked(
    deployment: Deployment,
    fake_gemini: FakeGemini,  # noqa: F811
) -> None:
    # The production wiring: the turn waits its 300 ms, the call to Gemini goes on (it is
    # paid) and is booked when it ends, half a second in.
    slow = FakeReply.text("coffee preferences of Ada", prompt_tokens=40, completion_tokens=8)
    fake_gemini.reply(FakeReply.delay(0.5, slow))
    settings = deployment.settings
    llm = {"api_key": SecretStr("test-key"), "base_url": fake_gemini.url}
    deployment.settings = settings.model_copy(
        update={
            "llm": settings.llm.model_copy(update=llm),
            "read_path": settings.read_path.model_copy(update={"rewrite": "gemini"}),
        }
    )
    read_path = deployment.settings.read_path
    assert read_path.rewrite_timeout_ms < 500  # the default turn limit, shorter than the call

    def check(c: wiring.Core) -> None:
        seed_core(c, "ada", [make_fact("ada", "Ada takes her coffee black")], org="org-a")
        service = wiring.context_service(c)
        try:
            bundle = service.assemble(ADA, "how does she take it?")
            assert bundle.rewritten_query is None  # the turn went on without the answer
            wait_for("the late call booked", lambda: booked(c) == [(48,)], 20)
        finally:
            service.close()

    deployment.with_core(check)
    rows = deployment.query(
        "SELECT model, units, organization_id FROM credit_ledger"
        " WHERE user_id = 'ada' AND run_id IS NULL AND operation = 'llm'"
    )
    assert rows == [("gemini-2.5-flash-lite", 48, "org-a")]
    # The server is not told to give up at the turn's limit either.
    (sent,) = fake_gemini.requests
    headers = {k.lower(): v for k, v in sent.headers.items()}
    assert headers["x-server-timeout"] == str(math.ceil(read_path.rewrite_call_timeout_ms / 1000))


def booked(c: wiring.Core) -> list[tuple[int]]:
    with c.pool.connection() as conn:
        return conn.execute(
            "SELECT units FROM credit_ledger"
            " WHERE user_id = 'ada' AND run_id IS NULL AND operation = 'llm'"
        ).fetchall()
