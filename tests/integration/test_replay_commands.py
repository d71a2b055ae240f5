"""`memoryd replay` and `memoryd replay verify` through the CLI's entry on a real database:
a batch the model cannot answer is bisected as the live flush bisects it, every call's tokens
are counted, a replay that calls a paid model says so first, and a replay or a check that
left something out exits non-zero."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import closing
from typing import Any

import pytest

from domain.erasure import ErasureReceipt
from domain.ids import MemoryKey
from domain.model import TokenUsage
from memoryd import cli, wiring
from memoryd.erasure import ErasureRequest
from processors.cost import PriceTable
from producers.contract import ContextEvent
from tests.support.builders import make_event
from tests.support.deployment import Deployment
from tests.support.fake_gemini import FakeGemini, FakeReply, RecordedRequest

pytestmark = pytest.mark.integration

ORG = "org-a"
POISON = "POISON"
PROMPT_TOKENS = 1_000
CUT_TOKENS = 8_192
# Unlike each other, so the gate keeps one fact for each.
SAID = [
    "I work in engineering at Initech",
    "I prefer short answers with code examples",
    "Project Falcon ships the billing API by December 15",
    "I live in Lisbon",
    f"{POISON} " + "~" * 300,
    "I am training for the Berlin marathon in April",
    "My manager is Grace Hopper",
    "I need to send the launch checklist to Grace",
]


@pytest.fixture
def fake() -> Iterator[FakeGemini]:
    with FakeGemini() as server:
        yield server


def note_taker(request: RecordedRequest) -> FakeReply:
    """One fact per observation; an answer cut short (and billed) for a batch with the poison."""
    observations = request.observations
    if any(POISON in text for _, text in observations):
        cut = '{"updated_working_memory": "The user'
        return FakeReply.text(cut, "MAX_TOKENS", PROMPT_TOKENS, CUT_TOKENS)
    facts = [
        {
            "op": "add",
            "content": f"The user said: {text}",
            "type": "profile",
            "confidence": 0.95,
            "salience": 0.6,
            "surface": "speak",
            "target_fact_id": None,
            "evidence": [label],
        }
        for label, text in observations
    ]
    answer = {"updated_working_memory": "Notes.", "updated_scaffold": {}, "facts": facts}
    return FakeReply.json(answer, PROMPT_TOKENS, completion_tokens=40 * len(observations))


def completion_tokens(request: RecordedRequest) -> int:
    observations = request.observations
    return CUT_TOKENS if any(POISON in t for _, t in observations) else 40 * len(observations)


def memoryd(
    deployment: Deployment,
    monkeypatch: pytest.MonkeyPatch,
    *argv: str,
    gemini: FakeGemini | None = None,
) -> int:
    """`memoryd ARGV` as a shell runs it, its settings from the environment."""
    s = deployment.settings
    env = {
        "MEMORYD_POSTGRES__DSN": s.postgres.dsn,
        "MEMORYD_CHROMA__MODE": "embedded",
        "MEMORYD_CHROMA__PATH": str(s.chroma.path),
        "MEMORYD_METRICS__ENABLED": "false",
        "MEMORYD_ERASURE__SUBJECT_KEY": s.erasure.subject_key.get_secret_value(),
    }
    if gemini is not None:  # the backend production runs with, so a replay's default
        env |= {
            "MEMORYD_LLM__BACKEND": "gemini",
            "MEMORYD_LLM__API_KEY": "test-key",
            "MEMORYD_LLM__BASE_URL": gemini.url,
        }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(cli, "configure_logging", lambda *_args: None)
    return cli.main(list(argv))


def replay_with_a_poison(
    deployment: Deployment,
    fake: FakeGemini,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    events: list[ContextEvent],
    responder: Callable[[RecordedRequest], FakeReply] = note_taker,
) -> tuple[int, dict[str, Any], str]:
    """(exit code, JSON document, stderr) of a replay of `events` in one batch, by the model."""
    deployment.with_core(lambda c: c.events.append([(e, None) for e in events]))
    fake.responder = responder
    code = memoryd(
        deployment, monkeypatch, "replay", "--org", ORG, "ada", "--max-batch", "8", "--json",
        gemini=fake,
    )  # fmt: skip
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def test_a_replay_bisects_a_batch_the_model_cannot_answer_and_counts_every_call(
    deployment: Deployment,
    fake: FakeGemini,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    events = [make_event("ada", text, minutes=i) for i, text in enumerate(SAID)]
    _, doc, _ = replay_with_a_poison(deployment, fake, monkeypatch, capsys, events)

    # Only the poison is left out: the other seven were consolidated together, in one run.
    [failed] = doc["failed_batches"]
    assert failed["event_ids"] == [str(events[4].event_id)]
    assert "MAX_TOKENS" in failed["error"]
    assert "bisected out of a batch of 8" in failed["error"]
    assert doc["shadow_runs"] == doc["shadow"]["version"] == 1
    good = [text for text in SAID if POISON not in text]
    assert sorted(t for _, t in fake.requests[-1].observations) == sorted(good)
    assert doc["shadow"]["facts"] == len(good)
    # Every call the model answered was billed: the cut answers and the probes too.
    assert len(fake.requests) > 2
    usages = [TokenUsage(PROMPT_TOKENS, completion_tokens(r)) for r in fake.requests]
    assert doc["tokens"] == {
        "prompt": PROMPT_TOKENS * len(fake.requests),
        "completion": sum(u.completion_tokens for u in usages),
    }
    prices: PriceTable = deployment.with_core(lambda c: c.prices)
    assert doc["cost_micro_usd"] == sum(
        prices.llm_cost_micro_usd("gemini-2.5-flash", u) for u in usages
    )
    assert doc["cost_micro_usd"] > 0


def test_a_replay_by_a_paid_model_says_so_first_and_exits_1_if_it_left_events_out(
    deployment: Deployment,
    fake: FakeGemini,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    events = [make_event("ada", text, minutes=i) for i, text in enumerate(SAID)]
    before_the_calls: list[str] = []

    def responder(request: RecordedRequest) -> FakeReply:
        if not before_the_calls:
            before_the_calls.append(capsys.readouterr().err)
        return note_taker(request)

    code, _, err = replay_with_a_poison(deployment, fake, monkeypatch, capsys, events, responder)

    # Said before the first call; then how the shadow falls short, so that a script does not
    # take its diff for a clean comparison.
    paid = "calls the paid model gemini-2.5-flash for 1 batch(es) of 8 event(s)"
    assert before_the_calls == [f"memoryd replay: {paid}; the cost is reported at the end\n"]
    assert err == "memoryd replay: 1 batch(es) failed, 1 of 8 event(s) left out of the shadow\n"
    assert code == 1


def test_a_replay_with_no_failed_batch_and_no_paid_model_exits_0_quietly(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    events = [make_event("ada", text, minutes=i) for i, text in enumerate(SAID[:4])]
    deployment.with_core(lambda c: c.events.append([(e, None) for e in events]))

    assert memoryd(deployment, monkeypatch, "replay", "--org", ORG, "ada", "--json") == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["failed_batches"] == []
    assert err == ""


def test_verify_of_a_deployment_or_an_organization_with_no_memory_is_refused_not_passed(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The wrong database, or one not yet written: "0 of 0 memories fold" checked nothing.
    code = memoryd(deployment, monkeypatch, "replay", "verify", "--all")
    out, err = capsys.readouterr()
    assert (out, err) == ("", "memoryd replay verify: no memory in any organization\n")
    assert code == 1

    deployment.with_core(lambda c: c.events.append([(make_event("ada", SAID[0]), None)]))

    assert memoryd(deployment, monkeypatch, "replay", "verify", "--all", "--org", ORG) == 0
    assert capsys.readouterr().out.endswith("1 of 1 memories fold to live memory\n")

    code = memoryd(deployment, monkeypatch, "replay", "verify", "--all", "--org", "org-typo")
    out, err = capsys.readouterr()
    assert (out, err) == ("", "memoryd replay verify: no memory of organization org-typo\n")
    assert code == 1


def test_verify_of_a_user_with_no_memory_is_refused_and_of_an_erased_one_says_so(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    said = [(make_event(user, SAID[0]), None) for user in ("ada", "bob")]
    deployment.with_core(lambda c: c.events.append(said))
    verify = ("replay", "verify", "--org", ORG, "--user")

    assert memoryd(deployment, monkeypatch, *verify, "ada") == 0
    assert capsys.readouterr().out.endswith("1 of 1 memories fold to live memory\n")

    # A mistyped user: an empty log folds to an empty memory, which is no check at all.
    code = memoryd(deployment, monkeypatch, *verify, "adaa")
    out, err = capsys.readouterr()
    nothing = f"memoryd replay verify: no memory {ORG}/adaa: no event, no run, no memory row\n"
    assert (out, err) == ("", nothing)
    assert code == 1

    def forget_bob(c: wiring.Core) -> ErasureReceipt:
        with closing(wiring.publisher(deployment.settings)) as pub:
            request = ErasureRequest("analyst", "test")
            return wiring.eraser(c, pub).forget(MemoryKey(ORG, "bob"), request)

    receipt = deployment.with_core(forget_bob)
    # An erasure leaves no event, run or row of the memory: the refusal says what happened.
    code = memoryd(deployment, monkeypatch, *verify, "bob")
    out, err = capsys.readouterr()
    assert out == ""
    erased = f"memoryd replay verify: memory {ORG}/bob was erased (erasure {receipt.erasure_id},"
    assert err.startswith(f"{erased} completed at ")
    assert err.endswith("): nothing of it is left to verify\n")
    assert code == 1


def test_verify_of_a_user_with_only_a_credit_line_and_read_audit_rows_is_refused(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Neither is made or read by the fold: a user with only those has nothing to verify.
    deployment.with_core(lambda c: c.memory.set_credit(MemoryKey(ORG, "ada"), 1_000))
    deployment.query(
        "INSERT INTO context_logs (log_id, organization_id, user_id, query, memory_version,"
        " injected, retrieved, latency_ms, degraded)"
        " VALUES (gen_random_uuid(), %s, 'ada', 'q', 0, '{}', '[]', 1, false) RETURNING log_id",
        (ORG,),
    )

    code = memoryd(deployment, monkeypatch, "replay", "verify", "--org", ORG, "--user", "ada")
    out, err = capsys.readouterr()
    nothing = f"memoryd replay verify: no memory {ORG}/ada: no event, no run, no memory row\n"
    assert (out, err) == ("", nothing)
    assert code == 1

    code = memoryd(deployment, monkeypatch, "replay", "verify", "--all", "--org", ORG)
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"memoryd replay verify: no memory of organization {ORG}\n")
    assert code == 1


def test_verify_json_names_a_refusal_on_stdout_in_the_shape_of_a_verdict(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    verify = ("replay", "verify", "--json", "--org", ORG)
    code = memoryd(deployment, monkeypatch, *verify, "--all")
    out, err = capsys.readouterr()
    refused = f"no memory of organization {ORG}"
    assert json.loads(out) == {"ok": False, "refused": refused, "memories": []}
    assert err == f"memoryd replay verify: {refused}\n"
    assert code == 1

    code = memoryd(deployment, monkeypatch, *verify, "--user", "adaa")
    out, _ = capsys.readouterr()
    refused = f"no memory {ORG}/adaa: no event, no run, no memory row"
    assert json.loads(out) == {"ok": False, "refused": refused, "memories": []}
    assert code == 1

    deployment.with_core(lambda c: c.events.append([(make_event("ada", SAID[0]), None)]))
    assert memoryd(deployment, monkeypatch, *verify, "--user", "ada") == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["ok"], doc["refused"]) == (True, None)
    assert [(m["user_id"], m["ok"]) for m in doc["memories"]] == [("ada", True)]


def test_a_replay_waits_out_rate_limits_as_long_as_the_provider_asks_and_exits_0(
    deployment: Deployment,
    fake: FakeGemini,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A backoff shorter than the quota's delay, so the wait is the provider's.
    monkeypatch.setenv("MEMORYD_PROCESSOR__BACKOFF_BASE_S", "0.01")
    monkeypatch.setenv("MEMORYD_PROCESSOR__BACKOFF_MAX_S", "0.01")
    quota = FakeReply.status(429, "Resource has been exhausted", retry_delay="0.2s")
    fake.reply(quota, quota)
    good = [text for text in SAID if POISON not in text]
    events = [make_event("ada", text, minutes=i) for i, text in enumerate(good)]
    code, doc, err = replay_with_a_poison(deployment, fake, monkeypatch, capsys, events)

    assert (code, doc["failed_batches"], doc["shadow_runs"]) == (0, [], 1)
    assert doc["shadow"]["facts"] == len(good)
    assert "left out of the shadow" not in err
    first, second, answered = (r.at for r in fake.requests)
    assert second - first >= 0.2
    assert answered - second >= 0.2
    # The provider's delay, not a backoff of seconds of the replay's own.
    assert answered - first < 2.0
    # The rate limits used no tokens: the answer's are all the replay's.
    assert doc["tokens"] == {"prompt": PROMPT_TOKENS, "completion": 40 * len(good)}


def test_a_replay_whose_key_is_refused_stops_at_once_with_exit_77_and_no_diff(
    deployment: Deployment,
    fake: FakeGemini,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    events = [make_event("ada", text, minutes=i) for i, text in enumerate(SAID[:6])]
    deployment.with_core(lambda c: c.events.append([(e, None) for e in events]))
    expired = FakeReply.status(400, "API key expired. Please renew it.", reason="API_KEY_INVALID")
    # The first batch is answered; the key is revoked before the second.
    fake.responder = lambda r: expired if fake.requests[:-1] else note_taker(r)
    code = memoryd(
        deployment, monkeypatch, "replay", "--org", ORG, "ada", "--max-batch", "2", "--json",
        gemini=fake,
    )  # fmt: skip
    out, err = capsys.readouterr()

    assert code == 77
    assert out == ""  # no diff: the shadow lacks what was never asked
    assert len(fake.requests) == 2  # not retried, and no later batch asked
    prices: PriceTable = deployment.with_core(lambda c: c.prices)
    paid = prices.llm_cost_micro_usd("gemini-2.5-flash", TokenUsage(PROMPT_TOKENS, 80))
    assert err.splitlines()[-1] == (
        "memoryd replay: stopped, the backend refused the credentials (gemini answered 400"
        " INVALID_ARGUMENT: API key expired. Please renew it.): fix MEMORYD_LLM__API_KEY (or"
        " its project's access) and run the replay again; no diff was made; 2 call(s) made,"
        f" {paid} micro-USD spent"
    )
