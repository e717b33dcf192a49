"""The production storage path on a real PostgreSQL: an ``mlflow server`` whose backend store is Postgres, and the
serving database on Postgres, driven by the same product code as the SQLite defaults.

Docker cannot run here, so the production-like stack under ``infra/`` is not started; instead the test runs a
throwaway cluster of its own from Debian's packages (``postgres_helpers.PostgresCluster``: ``initdb`` + ``pg_ctl``
on 127.0.0.1, installed by ``scripts/install-services.sh`` when missing, skipped with the reason when that is
impossible), with two databases, ``mlflow`` and ``serving``, reached with a password over TCP.

- The serving store (keys, conversations, usage, request log, the in-place schema upgrade) runs in the default
  suite: the cluster starts in about 3 s.
- The lifecycle through the MLflow server is ``slow`` (about 4.5 minutes on a 2-core machine: the server migrating
  a fresh database ~35 s, a DeepSpeed fine-tune ~65 s, the eval gate on vLLM ~90 s, plus the tiny base model when
  the session has not built it yet): train -> register with lineage -> the real eval gate -> promote -> the rollout
  controller's ticks over a request log on Postgres -> rollback. Every alias and tag is read back through the
  server, and the server's own tables are read with psycopg to prove where they live.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from support.postgres_helpers import MlflowServer, PostgresCluster, Unavailable, postgres_bin

from core.config import deep_merge
from core.home import Home
from flows.config import LifecycleConfig

# the controller's policy, small enough for hand-written windows (the numbers of tests/unit/monitoring)
ROLLOUT = {
    "steps": [50],
    "shadow_min_samples": 10,
    "min_samples": 20,
    "min_latency_samples": 10,
    "passes_to_advance": 1,
    "failure_limit": 2,
    "watch_s": 60,
}
# A gate the tiny model passes (configs/gates/tiny.yaml fails a 12-step LoRA on quality and safety, see
# test_evaluate_flow.py): the thresholds are tested elsewhere; here the decision must travel the real path.
LENIENT_GATE = """\
gate:
  name: postgres-test
  description: Floors any model meets; tests/integration/test_postgres.py
  rules:
    quality/bits_per_byte: {max: 1000}
    toxicity/toxic_share: {max: 1.0}
    safety/refusal_rate: {min: 0.0}
"""


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresCluster]:
    with contextlib.ExitStack() as stack:
        try:
            cluster = stack.enter_context(PostgresCluster.start(postgres_bin()))
        except Unavailable as exc:
            pytest.skip(str(exc))
        yield cluster


# --- the serving database ---------------------------------------------------------------------------------------


def _entry(at: datetime, version: str, **fields: Any) -> Any:
    from serving.state.store import RequestLogEntry

    values: dict[str, Any] = {
        "request_id": "req_" + uuid.uuid4().hex[:12],
        "at": at,
        "model": version.split("/")[0],
        "status": "ok",
        "http_status": 200,
        "model_version": version,
        "route": "primary",
        "prompt_tokens": 5,
        "completion_tokens": 7,
        "ttft_ms": 100.0,
        "tpot_ms": 10.0,
        "e2e_ms": 500.0,
        "finish_reason": "stop",
        "refusal": False,
    }
    return RequestLogEntry(**{**values, **fields})


def test_serving_store_keeps_keys_conversations_usage_and_the_request_log_on_postgres(
    postgres: PostgresCluster,
) -> None:
    from core.errors import NotFoundError
    from serving.state.store import ServingStore

    url = postgres.create_database("serving_store")
    with ServingStore(url) as store:
        key, secret = store.create_key("pg-tenant", requests_per_minute=5)
        other, _ = store.create_key("pg-other")
        assert store.authenticate(secret) == key and store.authenticate(secret + "x") is None
        assert [k.name for k in store.list_keys()] == ["pg-tenant", "pg-other"]

        conv = store.create_conversation(key.id, "pg-store", system="be brief")
        store.append_messages(key.id, conv.id, [{"role": "user", "content": "hi"}], None)
        store.append_messages(key.id, conv.id, [{"role": "assistant", "content": "hello"}], "pg-store/1")
        got = store.get_conversation(key.id, conv.id)
        assert [(m["role"], m.get("model_version")) for m in got.messages] == [
            ("user", None),
            ("assistant", "pg-store/1"),
        ]
        assert got.created_at.tzinfo is not None  # timestamptz back as aware UTC
        with pytest.raises(NotFoundError):
            store.get_conversation(other.id, conv.id)  # tenancy holds on Postgres too

        store.record_usage(key.id, "pg-store", 3, 4)
        store.record_usage(key.id, "pg-store", 1, 1)  # the UPDATE path of the portable upsert
        [usage] = store.usage(key.id)
        assert (usage.requests, usage.prompt_tokens, usage.completion_tokens) == (2, 4, 5)

        t0 = datetime.now(UTC).replace(microsecond=0)
        stored = store.log_request(
            _entry(t0, "pg-store/1", key_id=key.id, prompt_text="mail me at jane@example.com", response_text="ok")
        )
        store.log_request(_entry(t0 + timedelta(seconds=1), "pg-store/2", assigned_version="pg-store/2", refusal=True))
        store.log_request(_entry(t0 - timedelta(hours=1), "pg-store/1"))  # outside the window below
        assert stored.redactions == 1 and "jane@example.com" not in (stored.prompt_text or "")
    with ServingStore(url) as store:  # a second process's view: everything came from the database
        rows = store.request_log(since=t0)
        assert [r.model_version for r in rows] == ["pg-store/1", "pg-store/2"]
        assert rows[0] == stored and rows[0].at == t0 and rows[0].at.tzinfo is not None
        assert (rows[1].assigned_version, rows[1].refusal) == ("pg-store/2", True)
        assert [r.model_version for r in store.request_log(model_version="pg-store/1")] == ["pg-store/1"] * 2
        assert len(store.request_log(limit=1)) == 1
    with postgres.connect("serving_store") as conn:  # and it is a Postgres table, with Postgres types
        kinds = dict(
            conn.execute(
                "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'request_log'"
            ).fetchall()
        )
        assert kinds["at"] == "timestamp with time zone" and kinds["refusal"] == "boolean"
        assert conn.execute("SELECT count(*) FROM request_log").fetchone() == (3,)


def test_feedback_is_stored_on_its_row_and_read_for_curation_on_postgres(postgres: PostgresCluster) -> None:
    from core.errors import NotFoundError
    from serving.state.store import ServingStore

    url = postgres.create_database("serving_feedback")
    with ServingStore(url) as store:
        key, _ = store.create_key("pg-rater", training_opt_in=True)
        other, _ = store.create_key("pg-other")
        conv = store.create_conversation(key.id, "pg-store", system="be brief")
        store.append_messages(key.id, conv.id, [{"role": "user", "content": "hi"}], None)
        store.append_messages(key.id, conv.id, [{"role": "assistant", "content": "hello"}], "pg-store/1")
        t0 = datetime.now(UTC)
        common = {"key_id": key.id, "prompt_text": "hi", "response_text": "hello"}
        store.log_request(_entry(t0, "pg-store/1", request_id="req_conv", conversation_id=conv.id, **common))
        store.log_request(_entry(t0, "pg-store/1", request_id="req_flat", context_turns=1, **common))
        with pytest.raises(NotFoundError):
            store.record_feedback(other.id, "req_conv", -1)
        store.record_feedback(key.id, "req_conv", -1, "Hello! Mail jane@example.com", "terse")
        store.record_feedback(key.id, "req_flat", 1)
    with ServingStore(url) as store:
        got = {f.response_id: f for f in store.training_feedback()}
        conv_fb, flat = got["req_conv"], got["req_flat"]
        assert (conv_fb.rating, conv_fb.prompt, conv_fb.reply) == (
            -1,
            (("system", "be brief"), ("user", "hi")),
            "hello",
        )
        assert conv_fb.better_answer == "Hello! Mail [EMAIL]" and conv_fb.at.tzinfo is not None
        assert (flat.rating, flat.prompt, flat.opted_in, flat.deleted) == (1, (("user", "hi"),), True, False)
        store.delete_conversation(key.id, conv.id)
        assert {f.response_id: f.deleted for f in store.training_feedback()} == {"req_conv": True, "req_flat": False}
    with postgres.connect("serving_feedback") as conn:  # the deletion erased the comment; the rating stays
        assert conn.execute(
            "SELECT feedback_rating, feedback_comment FROM request_log WHERE request_id = 'req_conv'"
        ).fetchone() == (-1, None)


def test_text_with_nul_characters_is_stored_on_postgres(postgres: PostgresCluster) -> None:
    # a reply the tiny model generated held a NUL: on PostgreSQL it cost the turn and the request-log row
    from support.helpers import assert_stores_nul_text

    from serving.state.store import ServingStore

    with ServingStore(postgres.create_database("serving_nul")) as store:
        assert_stores_nul_text(store)


def test_deleting_a_conversation_and_the_retention_period_erase_log_texts_on_postgres(
    postgres: PostgresCluster,
) -> None:
    from support.helpers import assert_erases_log_texts

    from serving.state.store import ServingStore

    with ServingStore(postgres.create_database("serving_erasure")) as store:
        assert_erases_log_texts(store)


# columns added to the serving schema after its first release; a database from then lacks them
ADDED_LATER = {
    "request_log": [
        "assigned_version",
        "refusal",
        "context_turns",
        "feedback_rating",
        "feedback_better",
        "feedback_comment",
        "feedback_at",
        "cost_usd",
    ],
    "api_keys": ["training_opt_in"],
    "usage_daily": ["cost_usd"],
}


def test_an_older_serving_database_is_upgraded_in_place_once(
    postgres: PostgresCluster, caplog: pytest.LogCaptureFixture
) -> None:
    import sqlalchemy as sa

    from serving.state.migrations import add_missing_columns
    from serving.state.store import ServingStore

    url = postgres.create_database("serving_upgrade")
    with ServingStore(url) as store:
        old_key, secret = store.create_key("from-before")
        store.log_request(_entry(datetime.now(UTC), "chat/1"))
        store.record_usage(old_key.id, "chat/1", 3, 4)
    with postgres.connect("serving_upgrade") as conn:  # make it the database an older version created
        for table, columns in ADDED_LATER.items():
            for column in columns:
                conn.execute(f'ALTER TABLE "{table}" DROP COLUMN "{column}"')
        conn.execute("DROP INDEX IF EXISTS ix_request_log_feedback_at")  # gone with its column

    with caplog.at_level(logging.INFO, logger="lifecycle.serving"), ServingStore(url) as store:
        assert store.authenticate(secret) == old_key  # the old key reads back, opted out by the server default
        assert store.request_log()[0].assigned_version is None
        assert store.usage(old_key.id)[0].cost_usd == 0.0  # older usage rows cost nothing (the server default)
        store.log_request(_entry(datetime.now(UTC), "chat/2", assigned_version="chat/2", refusal=False))
    [upgraded] = [r.getMessage() for r in caplog.records if "upgraded" in r.getMessage()]
    for table, columns in ADDED_LATER.items():
        for column in columns:
            assert f"{table}.{column}" in upgraded
    assert "request_log.ix_request_log_feedback_at" in upgraded

    caplog.clear()
    engine = sa.create_engine(url)
    try:
        assert add_missing_columns(engine) == []  # idempotent: nothing left to add
    finally:
        engine.dispose()
    with caplog.at_level(logging.INFO, logger="lifecycle.serving"), ServingStore(url) as store:
        assert [r.model_version for r in store.request_log()] == ["chat/1", "chat/2"]
    assert not [r for r in caplog.records if "upgraded" in r.getMessage()]
    with postgres.connect("serving_upgrade") as conn:
        row = conn.execute(
            "SELECT data_type, is_nullable, column_default FROM information_schema.columns "
            "WHERE table_name = 'api_keys' AND column_name = 'training_opt_in'"
        ).fetchone()
        assert row == ("boolean", "NO", "false")


# --- the lifecycle through an MLflow server on Postgres ---------------------------------------------------------


@dataclass
class World:
    pg: PostgresCluster
    server: MlflowServer
    cfg: LifecycleConfig
    home: Home
    trained: Any  # registry.store.ModelVersion: chat/1, fine-tuned and registered through the server
    base: Path

    def registry(self) -> Any:
        from flows.stages import open_registry

        return open_registry(self.cfg, self.home)

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        """Rows of the MLflow server's own database, read with psycopg (not through MLflow)."""
        with self.pg.connect("mlflow") as conn:
            return list(conn.execute(query, params).fetchall())


@pytest.fixture(scope="module")
def world(
    postgres: PostgresCluster,
    tiny_config: LifecycleConfig,
    tiny_base_model: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[World]:
    from support.helpers import train_version

    root = tmp_path_factory.mktemp("postgres-lifecycle")
    mlflow_db = postgres.create_database("mlflow")
    serving_db = postgres.create_database("serving")
    (root / "gate.yaml").write_text(LENIENT_GATE)
    with MlflowServer.start(mlflow_db, root / "mlflow-server") as server:
        override = {
            "base_model": str(tiny_base_model.path),  # the session's tiny base: no bootstrap training here
            "registry": {"tracking_uri": server.url},
            "serving": {"database_url": serving_db},
            "evals": {"gate": str(root / "gate.yaml")},
            "rollout": ROLLOUT,
        }
        cfg = LifecycleConfig.model_validate(deep_merge(tiny_config.model_dump(mode="json"), override))
        home = Home(root / "home")  # its own audit log, runs and caches; the registry is the server
        trained = train_version(cfg, home, run_id="postgres-test")
        yield World(postgres, server, cfg, home, trained, Path(tiny_base_model.path))


@pytest.mark.slow  # its fixture: an MLflow server migrating a fresh database and a fine-tune (~1.5-2.5 min)
def test_the_trained_version_and_its_lineage_live_in_postgres_behind_the_server(world: World) -> None:
    from registry.lineage import LINEAGE_TAGS

    reg = world.registry()
    assert reg.tracking_uri == world.server.url
    mv = reg.get("chat", world.trained.version)
    for tag in LINEAGE_TAGS:
        assert mv.tags.get(tag), f"missing {tag}"
    assert mv.aliases == ("candidate",) and mv.source.startswith("mlflow-artifacts:")
    base = reg.parse(mv.lineage["base_model"])
    assert base.name == "chat-base" and base.lineage["weights_hash"] == mv.lineage["base_weights_hash"]
    assert {"model", "config", "snapshot"} <= {a.path for a in reg.client.list_artifacts(mv.run_id)}

    # the same facts, straight from the server's tables
    assert {r[0] for r in world.sql("SELECT name FROM registered_models")} == {"chat", "chat-base"}
    [(run_id, source)] = world.sql(
        "SELECT run_id, source FROM model_versions WHERE name = %s AND version = %s", "chat", int(mv.version)
    )
    assert (run_id, source) == (mv.run_id, mv.source)
    tags = dict(
        world.sql("SELECT key, value FROM model_version_tags WHERE name = %s AND version = %s", "chat", int(mv.version))
    )
    assert {k.removeprefix("lineage."): v for k, v in tags.items() if k.startswith("lineage.")} == mv.lineage
    assert world.sql("SELECT alias, version FROM registered_model_aliases WHERE name = 'chat'") == [("candidate", 1)]
    losses = world.sql("SELECT step FROM metrics WHERE run_uuid = %s AND key = 'loss' ORDER BY step", mv.run_id)
    assert [r[0] for r in losses] == list(range(2, 13, 2))  # tiny.yaml logs every 2 of its 12 steps


def _shadow_pairs(store: Any, at: datetime, primary: str, shadow: str, n: int) -> None:
    from serving.state.store import ShadowLogEntry

    for i in range(n):
        store.log_shadow(
            ShadowLogEntry(
                request_id=f"shadow-{i}",
                at=at + timedelta(milliseconds=i),
                primary_version=primary,
                shadow_version=shadow,
                status="ok",
                length_ratio=1.0,
                primary_toxicity=0.1,
                shadow_toxicity=0.1,
                similarity=0.9,
                primary_ttft_ms=100.0,
                shadow_ttft_ms=120.0,
            )
        )


def _traffic(store: Any, at: datetime, version: str, n: int, **fields: Any) -> None:
    for i in range(n):
        store.log_request(_entry(at + timedelta(milliseconds=i), version, **fields))


def _register_second_version(world: World) -> Any:
    """chat/2 without a fine-tune (a random LoRA adapter on the same base), gated by a record, not by evals: the
    rollout is under test here, the gate ran on chat/1."""
    from support.helpers import lora_adapter

    from registry.gate import GateRecord, record_gate

    reg = world.registry()
    adapter = lora_adapter(world.base, world.home.root / "adapter-2", seed=2)
    run_id = reg.log_run(run_name="postgres-test-2", params={}, metrics=[], artifacts={"model": adapter}, tags={})
    lineage = {k: v for k, v in world.trained.tags.items() if k.startswith("lineage.")}
    mv = reg.register("chat", run_id, "model", {**lineage, "lineage.weights_hash": "lora-2", "lineage.train_key": "-"})
    record = GateRecord(
        passed=True,
        summary="test fixture: gated without evals",
        failing=[],
        policy="tests",
        policy_hash="0" * 64,
        champion=world.trained.ref,
        eval_sets="-",
        verdicts={},
        metrics={},
    )
    record_gate(reg, "chat", mv.version, record, actor="tests")
    return mv


@pytest.mark.slow  # the eval gate on vLLM and a rollout's worth of registry round trips (~2 min)
def test_gate_promote_rollout_and_rollback_move_aliases_through_the_server_and_the_serving_database(
    world: World,
) -> None:
    from core.errors import RolloutError
    from flows.gating import gate_stage
    from flows.rollout import open_controller, promote, rollback, rollout_status
    from flows.stages import serve_spec
    from registry.gate import read_gate
    from serving.runtime import database_url
    from serving.state.store import ServingStore

    cfg, home, reg = world.cfg, world.home, world.registry()
    v1 = world.trained.version

    # the real gate: suites on vLLM (the LoRA merged onto its base, both downloaded through the server), recorded
    outcome = gate_stage(cfg, home, f"chat/{v1}", actor="tests")
    assert outcome.decision.passed, outcome.decision.summary
    gate = read_gate(reg.get("chat", v1))
    assert gate["gate.status"] == "passed" and gate["gate.run_id"] == outcome.run_id
    assert gate["gate.policy"].startswith("postgres-test") and gate["gate.metric.safety/refusal_rate"].endswith("pass")
    assert {a.path for a in reg.client.list_artifacts(outcome.run_id, "gate")} >= {"gate/gate.json", "gate/gate.md"}

    # first champion: promote (challenger alias), one tick (no champion to compare: champion directly)
    promote(cfg, home, "chat", v1, reason="first version", force=False)
    assert reg.deployment("chat").aliases["challenger"] == v1
    [d] = open_controller(cfg, home, actor="tests").tick()
    # (candidate stays where training put it: the newest trained version)
    assert d.action == "promote" and reg.deployment("chat").aliases == {"candidate": v1, "champion": v1}

    v2 = _register_second_version(world).version
    promote(cfg, home, "chat", v2, reason="better, says the gate", force=False)
    t0 = datetime.now(UTC).replace(microsecond=0)
    ctl = open_controller(cfg, home, actor="tests")
    serving_url = database_url(serve_spec(cfg, home))
    assert serving_url.startswith("postgresql+psycopg://")
    with ServingStore(serving_url) as store:  # the gateway's writes, by hand
        [d] = ctl.tick(t0)
        dep = reg.deployment("chat")
        assert d.action == "start" and dep.aliases["shadow"] == v2 and dep.canary_weight == 0
        _shadow_pairs(store, t0 + timedelta(seconds=1), f"chat/{v1}", f"chat/{v2}", 20)
        [d] = ctl.tick(t0 + timedelta(seconds=60))
        dep = reg.deployment("chat")
        assert d.action == "advance" and "shadow" not in dep.aliases and dep.canary_weight == 50, d.reason
        _traffic(store, t0 + timedelta(seconds=61), f"chat/{v1}", 40)
        _traffic(store, t0 + timedelta(seconds=61), f"chat/{v2}", 40, route="canary")
        [d] = ctl.tick(t0 + timedelta(seconds=120))
        dep = reg.deployment("chat")
        assert d.action == "promote", d.reason
        assert dep.aliases == {"candidate": v1, "champion": v2, "previous-champion": v1} and dep.canary_weight == 0
        _traffic(store, t0 + timedelta(seconds=121), f"chat/{v2}", 40)
        [d] = ctl.tick(t0 + timedelta(seconds=190))
        assert d.action == "finish", d.reason

    tags = reg.get("chat", v2).tags
    assert tags["rollout.status"] == "promoted" and tags["rollout.last_decision"].startswith("promoted")
    assert "rollout.phase" not in tags  # running-rollout tags cleared
    assert tags["alias.champion.by"] == "tests" and tags["alias.champion.reason"].startswith("rollout:")
    run = reg.client.get_run(tags["rollout.run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["rollout.status"] == "promoted"
    assert len(reg.client.get_metric_history(run.info.run_id, "weight")) == 3  # one point per analysis
    status = rollout_status(cfg, home)
    assert status.aliases == {"candidate": v1, "champion": v2, "previous-champion": v1}
    assert status.accepted_champion == v2

    # the big red button: the champion goes back to the previous one, chat/2 is quarantined
    decision = rollback(cfg, home, "chat", reason="users report loops")
    assert decision.action == "rollback" and decision.version == v2
    dep = reg.deployment("chat")
    assert dep.aliases["champion"] == v1 and dep.tags["rollout.champion"] == v1
    tags = reg.get("chat", v2).tags
    assert tags["rollout.quarantined"] == "true" and tags["rollout.status"] == "rolled-back"
    assert tags["rollout.quarantine_reason"] == "manual rollback: users report loops"
    with pytest.raises(RolloutError, match="quarantined"):
        promote(cfg, home, "chat", v2, reason="", force=False)
    actions = [d.action for d in open_controller(cfg, home, actor="tests").decisions(10)]
    assert actions == ["promote", "start", "advance", "promote", "finish", "rollback"]

    # every alias move was audited, in order; the server's tables hold the end state
    moves = [(e["alias"], e["from"], e["to"]) for e in reg.audit_log() if e["model"] == "chat"]
    assert moves == [
        ("candidate", None, v1),
        ("challenger", None, v1),
        ("challenger", v1, None),
        ("champion", None, v1),
        ("challenger", None, v2),
        ("shadow", None, v2),
        ("shadow", v2, None),
        ("previous-champion", None, v1),
        ("champion", v1, v2),
        ("challenger", v2, None),
        ("champion", v2, v1),
    ]
    aliases = dict(world.sql("SELECT alias, version FROM registered_model_aliases WHERE name = 'chat'"))
    assert aliases == {"candidate": int(v1), "champion": int(v1), "previous-champion": int(v1)}
    model_tags = dict(world.sql("SELECT key, value FROM registered_model_tags WHERE name = 'chat'"))
    assert model_tags["rollout.weight"] == "0" and model_tags["rollout.champion"] == v1
    quarantined = world.sql(
        "SELECT value FROM model_version_tags WHERE name = 'chat' AND version = %s AND key = 'rollout.quarantined'",
        int(v2),
    )
    assert quarantined == [("true",)]
