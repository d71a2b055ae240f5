"""Replay and audit on real services: fold, memory at time T, shadow replay, export."""

from __future__ import annotations

import json
import tracemalloc
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from consumers.replay import batches_by_size, shadow_consolidate
from domain.model import FactStatus
from memoryd import wiring
from memoryd.analyst.commands import analyst_core, live_memory, memory_snapshot
from memoryd.analyst.export import export_document
from memoryd.analyst.verify import verify_memory
from memoryd.cli import build_parser
from memoryd.erasure import ErasureRequest
from memoryd.settings import Settings
from processors.consolidate import Consolidator
from processors.diff import diff_memory
from processors.fold import FoldedMemory, fold_runs, runs_until
from processors.gate import WriteGate
from processors.offline import OfflineBackend
from processors.schema import BackendResponse, ConsolidationRequest
from producers.contract import ContextEvent, EventType, Source
from tests.support.builders import key_of, make_event
from tests.support.deployment import Deployment

pytestmark = pytest.mark.integration

USER = "ada"
# Events of the long log an export is written from as it is read.
EXPORTED_EVENTS = 4_000

# Several batches, so runs build on each other: a correction contradicts an earlier fact,
# a repeated statement reinforces one, and every kind of explicit data is there.
BATCHES: tuple[tuple[tuple[str, EventType, dict[str, Any]], ...], ...] = (
    (
        ("I work in engineering at Initech", EventType.FACT, {}),
        ("I prefer short answers with code examples", EventType.PREFERENCE, {}),
        ("Project Falcon ships the billing API by December 15", EventType.PROJECT_DETAILS, {}),
        ("I live in Lisbon", EventType.FACT, {}),
    ),
    (
        ("Actually I moved to design last month", EventType.CORRECTION, {}),
        ("I prefer short answers with code examples", EventType.PREFERENCE, {}),
        (
            '"Product designer"',
            EventType.SCAFFOLD_UPDATE,
            {"source": Source.AUTONOMOUS, "scaffold_key": "Title"},
        ),
        ("Her manager is Grace Hopper", EventType.LEARNED_FACT, {"source": Source.AUTONOMOUS}),
    ),
    (
        ("The quarterly review with Acme is on Friday", EventType.FACT, {"connection_id": "mail"}),
        (
            "Acme prefers invoices in EUR",
            EventType.CONNECTION_UPDATE,
            {"connection_id": "mail", "source": Source.TOOL},
        ),
        ("I need to send the Falcon launch checklist to Grace", EventType.FACT, {}),
        ("I am training for the Berlin marathon in April", EventType.FACT, {}),
    ),
)


def batch(n: int) -> list[ContextEvent]:
    return [
        make_event(USER, content, kind, minutes=10 * n + i, **dict(extra))
        for i, (content, kind, extra) in enumerate(BATCHES[n])
    ]


def consolidate(deployment: Deployment, events: list[ContextEvent]) -> None:
    deployment.publish(events)
    deployment.run_both()


def images(deployment: Deployment) -> tuple[FoldedMemory, FoldedMemory, list[Any]]:
    """(live, folded, runs) for USER."""
    with analyst_core(deployment.settings) as (c, run_log):
        runs = run_log.runs(key_of(USER))
        return live_memory(c, run_log, key_of(USER)), fold_runs(runs), runs


def db_now(deployment: Deployment) -> datetime:
    value = deployment.query("SELECT clock_timestamp()")[0][0]
    assert isinstance(value, datetime)
    return value


def run_cli(deployment: Deployment, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    args = build_parser().parse_args(argv)
    assert args.fn(deployment.settings, args) == 0
    return capsys.readouterr().out


def table_digest(deployment: Deployment) -> dict[str, Any]:
    """Every table's full content, to prove that nothing was written."""
    tables = [
        r[0]
        for r in deployment.query(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
        )
    ]
    digest = "SELECT md5(coalesce(string_agg(x::text, '|' ORDER BY x::text), '')) FROM {} x"
    return {t: deployment.query(digest.format(t))[0][0] for t in tables}


def test_fold_of_the_runs_equals_live_memory(deployment: Deployment) -> None:
    # Small batches: one publish becomes several runs that build on each other.
    deployment.settings = deployment.settings.model_copy(
        update={"processor": deployment.settings.processor.model_copy(update={"max_batch": 3})}
    )
    for n in range(len(BATCHES)):
        consolidate(deployment, batch(n))

    live, folded, runs = images(deployment)
    succeeded = [r for r in runs if r.run.status.value == "succeeded"]
    assert len(succeeded) >= 4
    assert folded.version == live.version == len(succeeded)
    assert folded.working_memory == live.working_memory
    assert dict(folded.scaffold) == dict(live.scaffold)
    assert folded.scaffold["Title"] == "Product designer"
    assert folded.learned_info == live.learned_info
    assert (
        dict(folded.connections)
        == dict(live.connections)
        == {"mail": ("Acme prefers invoices in EUR",)}
    )
    assert folded.facts.keys() == live.facts.keys()
    for fact_id, fact in live.facts.items():
        mine = folded.facts[fact_id]
        assert (mine.content, mine.status, mine.superseded_by) == (
            fact.content,
            fact.status,
            fact.superseded_by,
        )
        assert (mine.fact_type, mine.surface, mine.version, mine.reinforce_count) == (
            fact.fact_type,
            fact.surface,
            fact.version,
            fact.reinforce_count,
        )
        assert (mine.confidence, mine.salience) == (fact.confidence, fact.salience)
        assert mine.provenance == fact.provenance
        assert (mine.created_by_run, mine.created_at) == (fact.created_by_run, fact.created_at)
    assert any(f.status is FactStatus.CONTRADICTED for f in live.facts.values())
    assert any(f.reinforce_count > 0 for f in live.facts.values())
    assert diff_memory(live, folded).identical
    assert fold_runs(runs) == folded  # deterministic


def test_a_contradicted_fact_stated_again_keeps_its_evidence_in_live_and_fold(
    deployment: Deployment,
) -> None:
    first, correction = batch(0), batch(1)
    consolidate(deployment, first)
    consolidate(deployment, correction)
    again = make_event(USER, BATCHES[0][0][0], EventType.FACT, minutes=100)
    consolidate(deployment, [again])

    live, folded, _ = images(deployment)
    [initech] = [f for f in live.facts.values() if "Initech" in f.content]
    assert initech.status is FactStatus.ACTIVE
    assert initech.provenance.source_event_ids == (first[0].event_id, again.event_id)
    # The fold does not track indexing; everything else is the live row.
    assert replace(folded.facts[initech.fact_id], indexed_at=initech.indexed_at) == initech
    assert diff_memory(live, folded).identical
    history = deployment.query(
        "SELECT operation, before IS NULL FROM fact_history h"
        " JOIN consolidation_runs r USING (run_id) WHERE fact_id = %s ORDER BY r.started_at",
        (initech.fact_id,),
    )
    assert history == [("add", True), ("contradict", False), ("add", False)]


def test_verify_holds_after_the_successor_of_a_contradicted_fact_is_erased(
    deployment: Deployment,
) -> None:
    consolidate(deployment, batch(0))
    consolidate(deployment, batch(1))  # "moved to design" contradicts "engineering"
    live, _, _ = images(deployment)
    [old] = [f for f in live.facts.values() if f.superseded_by is not None]
    with wiring.core(deployment.settings) as c, closing(wiring.publisher(c.settings)) as pub:
        wiring.eraser(c, pub).erase_fact(
            key_of(USER), old.superseded_by, ErasureRequest("test", "the user asked")
        )
    live, _, runs = images(deployment)
    assert live.facts[old.fact_id].superseded_by is None
    verification = verify_memory(key_of(USER), runs, live)
    assert verification.ok, verification.diff


def test_memory_at_a_time_is_the_fold_of_the_runs_committed_by_then(
    deployment: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    consolidate(deployment, batch(0))
    first_live, _, _ = images(deployment)
    t1 = db_now(deployment)
    consolidate(deployment, batch(1))
    second_live, _, runs = images(deployment)

    at_t1 = fold_runs(runs_until(runs, t1), FoldedMemory(user_id=USER, organization_id="org-a"))
    assert diff_memory(first_live, at_t1).identical
    assert at_t1.version == first_live.version < second_live.version
    assert diff_memory(second_live, fold_runs(runs_until(runs, db_now(deployment)))).identical
    long_ago = runs[0].finished_at.replace(year=2000)
    before_any = fold_runs(
        runs_until(runs, long_ago), FoldedMemory(user_id=USER, organization_id="org-a")
    )
    assert before_any.version == 0
    assert not before_any.facts

    doc = json.loads(
        run_cli(
            deployment,
            ["history", "--org", "org-a", USER, "--at", t1.isoformat(), "--json"],
            capsys,
        )
    )
    assert doc["memory"]["version"] == first_live.version
    assert doc["memory"]["working_memory"] == first_live.working_memory
    assert {f["fact_id"] for f in doc["memory"]["facts"]} == {str(i) for i in first_live.facts}
    assert len(doc["runs"]) == first_live.version

    listing = json.loads(
        run_cli(deployment, ["history", "--org", "org-a", USER, "--json"], capsys)
    )["runs"]
    assert [r["seq"] for r in listing] == [r.seq for r in runs]
    consumed = {r[0] for r in deployment.query("SELECT event_id::text FROM consolidated_events")}
    assert {e for r in listing for e in r["input_event_ids"]} == consumed
    for row in listing:
        assert row["backend"] == "offline"
        assert row["model"] == "offline-deterministic-v2"
        assert row["prompt_version"] == "offline-v3"
        assert row["status"] == "succeeded"
        assert set(row["gate"]) == {"allowed", "held", "discarded", "reinforced"}
        assert row["tokens"]["prompt"] > 0
        assert row["cost_micro_usd"] == 0

    text = run_cli(deployment, ["history", "--org", "org-a", USER], capsys)
    assert f"{len(runs)} run(s) of org-a/{USER}" in text
    assert str(runs[0].run.run_id) in text
    text = run_cli(deployment, ["history", "--org", "org-a", USER, "--at", t1.isoformat()], capsys)
    assert f"version {first_live.version}" in text
    assert "# Working memory" in text


class ForgetfulBackend:
    """The offline backend, but it keeps no facts and writes a different W: a 'worse model'."""

    name = "forgetful"
    model = "forgetful-v0"
    prompt_version = "forgetful-prompt"

    def __init__(self, inner: OfflineBackend) -> None:
        self._inner = inner

    def consolidate(self, request: ConsolidationRequest) -> BackendResponse:
        response = self._inner.consolidate(request)
        output = response.output.model_copy(
            update={"facts": [], "updated_working_memory": "Nothing worth remembering."}
        )
        return replace(response, output=output, model=self.model)


def test_shadow_replay_diffs_against_live_and_never_writes(
    deployment: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    consolidate(deployment, batch(0) + batch(1))
    consolidate(deployment, batch(2))
    before = table_digest(deployment)

    # The live backend on the live batches reproduces live memory exactly.
    argv = [
        "replay",
        "--org",
        "org-a",
        USER,
        "--backend",
        "offline",
        "--batching",
        "live",
        "--json",
    ]
    doc = json.loads(run_cli(deployment, argv, capsys))
    assert doc["diff"]["identical"], doc["diff"]
    assert doc["events"] == 12
    assert doc["failed_batches"] == []
    assert doc["backend"] == "offline"

    # Other batching: a real shadow run whose shape the diff reports.
    argv = ["replay", "--org", "org-a", USER, "--backend", "offline", "--max-batch", "5", "--json"]
    doc = json.loads(run_cli(deployment, argv, capsys))
    assert doc["batches"] == 3
    assert doc["shadow_runs"] == 3
    assert doc["shadow"]["version"] == 3
    assert doc["shadow_memory"]["scaffold"]["Title"] == "Product designer"
    assert set(doc["diff"]) >= {
        "facts_only_live",
        "facts_only_shadow",
        "facts_changed",
        "working_memory",
        "scaffold",
        "learned_info",
    }
    text = run_cli(
        deployment,
        ["replay", "--org", "org-a", USER, "--backend", "offline", "--max-batch", "5"],
        capsys,
    )
    assert "shadow replay of org-a/ada: 12 event(s) in 3 batch(es)" in text

    # A backend that keeps nothing: every live fact is reported as missing from the shadow.
    with analyst_core(deployment.settings) as (c, run_log):
        events = [e.event for e in c.events.user_events(key_of(USER))]
        shadow = shadow_consolidate(
            key_of(USER),
            batches_by_size(events, 10),
            ForgetfulBackend(OfflineBackend(c.embedder)),
            Consolidator(WriteGate(c.embedder), c.prices),
        )
        live = live_memory(c, run_log, key_of(USER))
    diff = diff_memory(live, shadow.memory)
    assert {f.fact_id for f in diff.only_left} == set(live.facts)
    assert not diff.only_right
    assert not diff.changed
    assert diff.working_memory == (live.working_memory, "Nothing worth remembering.")
    assert shadow.memory.learned_info == live.learned_info  # explicit data is kept as given
    assert all(r.backend == "forgetful" for r in shadow.runs)

    assert table_digest(deployment) == before


def test_an_analysts_reads_of_a_memory_are_of_one_moment(deployment: Deployment) -> None:
    # What export, explain and verify read of a memory: a run committed between two of their
    # reads made verify report a difference that was not there, and an export whose memory
    # version has no run behind it.
    first = batch(0)
    consolidate(deployment, first)
    with analyst_core(deployment.settings) as (c, _), memory_snapshot(c) as (at, run_log):
        before = at.memory.load_state(key_of(USER))
        runs = run_log.runs(key_of(USER))
        consolidate(deployment, batch(1))  # commits while the snapshot is open
        assert at.memory.load_state(key_of(USER)) == before
        assert run_log.runs(key_of(USER)) == runs
        live = live_memory(at, run_log, key_of(USER))
        assert verify_memory(key_of(USER), run_log.runs(key_of(USER)), live).ok
        assert [e.event.event_id for e in at.events.user_events(key_of(USER))] == [
            e.event_id for e in first
        ]
    live_now, _, runs_now = images(deployment)
    assert live_now.version > before.version
    assert len(runs_now) > len(runs)


def test_analyst_connections_are_read_only(deployment: Deployment) -> None:
    with (
        analyst_core(deployment.settings) as (c, _),
        pytest.raises(psycopg.errors.ReadOnlySqlTransaction),
        c.pool.connection() as conn,
    ):
        conn.execute("INSERT INTO user_credits (user_id, credit_micro_usd) VALUES ('x', 1)")


def test_an_export_it_cannot_write_is_one_line_and_exit_1(
    deployment: Deployment, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    consolidate(deployment, batch(0))
    (tmp_path / "a-file").write_text("")
    under_a_file = tmp_path / "a-file" / "ada.json"  # its folder cannot be made
    a_folder = tmp_path / "out" / "ada.json"  # the export's name is taken by a folder
    a_folder.mkdir(parents=True)
    for out in (under_a_file, a_folder):
        args = build_parser().parse_args(["export", "--org", "org-a", USER, "--out", str(out)])
        assert args.fn(deployment.settings, args) == 1
        assert f"memoryd export: cannot write {out}: " in capsys.readouterr().err
    # The temporary file the export was written to first is gone.
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["ada.json"]


def test_export_has_events_runs_facts_with_history_memory_and_ledger(
    deployment: Deployment, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = batch(0) + batch(1) + batch(2)
    consolidate(deployment, events)
    deployment.with_core(lambda c: wiring.indexer(c).drain_pending())

    def a_turn(c: wiring.Core) -> None:  # its audit row written when the read path closes
        with wiring.read_path(c) as service:
            service.assemble(key_of(USER), "Where does Ada work?")

    deployment.with_core(a_turn)
    out = tmp_path / "export" / "ada.json"

    text = run_cli(deployment, ["export", "--org", "org-a", USER, "--out", str(out)], capsys)
    assert text.startswith(f"exported {USER}: 12 event(s)")
    doc = json.loads(out.read_text())

    assert doc["format"] == "memoryd-export/1"
    assert doc["user_id"] == USER
    assert [e["event_id"] for e in doc["events"]] == [str(e.event_id) for e in events]
    assert all(e["seq"] and e["recorded_at"] for e in doc["events"])
    live, _, runs = images(deployment)
    assert [r["run_id"] for r in doc["runs"]] == [str(r.run.run_id) for r in runs]
    assert all(r["output"]["applied"] for r in doc["runs"])
    assert all(r["raw_response"] for r in doc["runs"])
    assert doc["memory"]["working_memory"] == live.working_memory
    assert doc["memory"]["scaffold"] == dict(live.scaffold)
    assert doc["memory"]["version"] == live.version
    assert doc["connections"] == {"mail": ["Acme prefers invoices in EUR"]}
    assert {f["fact_id"] for f in doc["facts"]} == {str(i) for i in live.facts}
    for fact in doc["facts"]:
        assert fact["history"], fact
        assert fact["history"][-1]["after"]["content"] == fact["content"]
        assert fact["indexed_at"] is not None
    ledger_runs = {e["run_id"] for e in doc["ledger"] if e["operation"] == "llm"}
    assert ledger_runs == {str(r.run.run_id) for r in runs}
    assert doc["balance_micro_usd"] is None  # no credit line: unlimited
    (turn,) = doc["context_logs"]  # the read audit: what the turn was shown
    assert turn["query"] == "Where does Ada work?"
    assert {r["fact_id"] for r in turn["retrieved"]} <= {f["fact_id"] for f in doc["facts"]}


def test_history_of_an_unknown_user_is_empty(
    deployment: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    listing = run_cli(deployment, ["history", "--org", "org-a", "nobody", "--json"], capsys)
    assert json.loads(listing) == {"organization_id": "org-a", "user_id": "nobody", "runs": []}
    at = ["history", "--org", "org-a", "nobody", "--at", "2030-01-01T00:00", "--json"]
    doc = json.loads(run_cli(deployment, at, capsys))
    assert doc["memory"]["version"] == 0
    assert doc["memory"]["facts"] == []


@contextmanager
def without_raw_responses(deployment: Deployment) -> Iterator[Settings]:
    """Settings for a role that may read everything but the model's raw responses."""
    role = f"analyst_{uuid.uuid4().hex[:8]}"
    readable = [
        r[0]
        for r in deployment.query(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_name = 'consolidation_runs' AND column_name <> 'raw_response'"
        )
    ]
    with psycopg.connect(deployment.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute(
            sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA public TO {}").format(
                sql.Identifier(role)
            )
        )
        conn.execute(
            sql.SQL("REVOKE SELECT ON consolidation_runs FROM {}").format(sql.Identifier(role))
        )
        conn.execute(
            sql.SQL("GRANT SELECT ({}) ON consolidation_runs TO {}").format(
                sql.SQL(", ").join(map(sql.Identifier, readable)), sql.Identifier(role)
            )
        )
    params = conninfo_to_dict(deployment.dsn)
    params["user"] = role
    postgres = deployment.settings.postgres.model_copy(update={"dsn": make_conninfo("", **params)})
    try:
        yield deployment.settings.model_copy(update={"postgres": postgres})
    finally:
        with psycopg.connect(deployment.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_history_and_explain_read_runs_in_pages_without_raw_responses(
    deployment: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    deployment.settings = deployment.settings.model_copy(
        update={"processor": deployment.settings.processor.model_copy(update={"max_batch": 2})}
    )
    for n in range(len(BATCHES)):
        consolidate(deployment, batch(n))
    _, _, runs = images(deployment)
    assert len(runs) > 3
    with analyst_core(deployment.settings) as (_, run_log):
        assert list(run_log.iter_runs(key_of(USER), raw_response=True, page=2)) == runs
        light = list(run_log.iter_runs(key_of(USER), output=False, page=3))
    assert [r.seq for r in light] == [r.seq for r in runs]
    assert all(r.run.output is None and r.run.raw_response is None for r in light)

    fact_id = deployment.query(
        "SELECT fact_id::text FROM memory_facts WHERE user_id = %s"
        " ORDER BY reinforce_count DESC, created_at LIMIT 1",
        (USER,),
    )[0][0]
    commands = [
        ["history", "--org", "org-a", USER, "--json"],
        ["history", "--org", "org-a", USER],
        ["history", "--org", "org-a", USER, "--at", db_now(deployment).isoformat(), "--json"],
        ["explain", fact_id, "--json"],
        ["explain", fact_id],
    ]
    with without_raw_responses(deployment) as restricted:
        for argv in commands:
            args = build_parser().parse_args(argv)
            assert args.fn(restricted, args) == 0, argv
            assert capsys.readouterr().out == run_cli(deployment, argv, capsys), argv
    explained = json.loads(run_cli(deployment, ["explain", fact_id, "--json"], capsys))
    assert explained["runs"]
    assert explained["events"]


def test_an_export_is_written_as_it_is_read(
    deployment: Deployment, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A long log of big events: held in memory at once, it is several times the export's size.
    long_log = [
        make_event(USER, f"note {i}: " + "x" * 6_000, minutes=i) for i in range(EXPORTED_EVENTS)
    ]
    deployment.with_core(lambda c: c.events.append([(e, None) for e in long_log]))
    said = batch(0)
    consolidate(deployment, said)
    out = tmp_path / "ada.json"
    argv = ["export", "--org", "org-a", USER, "--out", str(out)]

    tracemalloc.start()
    try:
        text = run_cli(deployment, argv, capsys)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    size = out.stat().st_size
    assert size > 6_000 * EXPORTED_EVENTS
    assert peak < size / 4, f"peak {peak} B for an export of {size} B"
    assert text.startswith(f"exported {USER}: {EXPORTED_EVENTS + len(said)} event(s)")
    with analyst_core(deployment.settings) as (c, _), memory_snapshot(c) as (at, run_log):
        now = datetime.fromisoformat(json.loads(out.read_text())["exported_at"])
        doc = export_document(at, run_log, key_of(USER), now)
    # Byte for byte what one json.dump of the whole document writes.
    assert out.read_text() == json.dumps(doc, ensure_ascii=False, indent=2, default=str)
    assert [e["event_id"] for e in doc["events"]] == [str(e.event_id) for e in long_log + said]
    assert doc["runs"]
    assert doc["facts"]
