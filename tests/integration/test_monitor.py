"""``lifecycle monitor`` and the retrain check on real parts: the champion in a real MLflow registry (SQLite) with
the tiny snapshot as its lineage, request-log rows in a real serving store, Evidently and the bundled MiniLM.

The simulated users are the held-out traffic prompts (``flows.traffic``): the plain profile after the champion's
promotion (its baseline), then the drifted profile with more refusals (the quality signal). The drifted window
triggers one retrain, recorded in the decision log, the monitor run and the registered model; the same window
checked again is held back by the loop guard and the cooldown.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from support.rollout_helpers import record_passing_gate

from core.config import deep_merge
from core.home import Home
from flows.config import LifecycleConfig

N = 150  # requests per window


@pytest.fixture(scope="module")
def world(tiny_config: LifecycleConfig, tiny_snapshot: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from flows.stages import open_registry

    home = Home(tmp_path_factory.mktemp("monitor-home"))
    # the snapshot lives in the session home: link it where this home looks for snapshots
    home.snapshots.mkdir(parents=True)
    (home.snapshots / tiny_snapshot.hash).symlink_to(Path(tiny_snapshot.path))
    cfg = LifecycleConfig.model_validate(
        deep_merge(
            tiny_config.model_dump(mode="json"),
            {"monitoring": {"drift": {"min_samples": 100}, "retrain": {"min_champion_share": 0.5}}},
        )
    )
    reg = open_registry(cfg, home)
    run_id = reg.log_run(run_name="monitor-test", params={}, metrics=[], artifacts={}, tags={})
    mv = reg.register("chat", run_id, "model", {"lineage.snapshot": tiny_snapshot.hash})
    record_passing_gate(reg, mv.version, "test fixture")
    reg.set_alias("chat", "champion", mv.version, reason="monitor test fixture", actor="tests")
    return cfg, home


def _log(cfg: LifecycleConfig, home: Home, profile: str, start: datetime, refusal_every: int) -> datetime:
    """``N`` answered requests of the profile from ``start`` on, one a second; returns the end of the window."""
    from flows.stages import serve_spec
    from flows.traffic import traffic_prompts
    from serving.runtime import database_url
    from serving.state.store import RequestLogEntry, ServingStore

    prompts = traffic_prompts(cfg.data.generator, profile, N, seed=3)
    with ServingStore(database_url(serve_spec(cfg, home))) as store:
        for i, prompt in enumerate(prompts):
            store.log_request(
                RequestLogEntry(
                    request_id=f"{profile}-{i}",
                    at=start + timedelta(seconds=i),
                    model="chat",
                    status="ok",
                    http_status=200,
                    model_version="chat/1",
                    alias="champion",
                    route="primary",
                    prompt_text=prompt,
                    response_text="I can't help with that." if i % refusal_every == 0 else "Sure.",
                    refusal=i % refusal_every == 0,
                    finish_reason="stop",
                )
            )
    return start + timedelta(seconds=len(prompts))


def test_drifted_users_with_more_refusals_trigger_one_retrain_then_the_guard_holds(world: Any) -> None:
    from flows.signals import monitor_stage, retrain_check_stage
    from flows.stages import open_registry

    cfg, home = world
    t0 = datetime.now(UTC) + timedelta(seconds=5)  # after the champion's promotion
    t1 = _log(cfg, home, "normal", t0, refusal_every=10)
    t2 = _log(cfg, home, "drifted", t1, refusal_every=2)

    plain = monitor_stage(cfg, home, start=t0, end=t1)
    assert plain.report.status == "no_drift", plain.report.reason
    assert plain.report.current_n == N and plain.report.reference_n > 0
    html = (plain.folder / "drift.html").read_text()
    assert "no_drift" in html or "no drift" in html.lower()
    assert len(html) < 3_000_000  # light: no t-SNE, no scripts

    check = retrain_check_stage(cfg, home, actor="tests", start=t1, end=t2)
    report = check.monitor.report
    assert report.status == "drifted", report.reason
    assert check.decision.retrain, check.decision.why_not
    assert any(r.startswith("refusal_rate") for r in check.decision.reasons), check.decision.reasons
    assert report.current_rates is not None and report.reference_rates is not None
    # recorded: the decision log, the monitor run (metrics, tags, the HTML), the registered model
    log = [json.loads(line) for line in home.decision_log("retrain").read_text().splitlines()]
    assert [e["decision"]["retrain"] for e in log] == [True]
    reg = open_registry(cfg, home)
    run = reg.client.get_run(check.monitor.run_id)
    assert run.data.tags["retrain.decision"] == "retrain" and run.data.tags["drift.status"] == "drifted"
    assert {Path(a.path).name for a in reg.client.list_artifacts(run.info.run_id, "drift")} >= {
        "drift.html",
        "drift.json",
    }
    assert reg.client.get_registered_model("chat").tags["retrain.last_decision"] == "retrain"

    again = retrain_check_stage(cfg, home, actor="tests", start=t1, end=t2)
    assert not again.decision.retrain
    held = " ".join(again.decision.why_not)
    assert "cooldown" in held and "loop guard" in held, again.decision.why_not
    log = [json.loads(line) for line in home.decision_log("retrain").read_text().splitlines()]
    assert [e["decision"]["retrain"] for e in log] == [True, False]
