"""The rollout controller's side effects, on an in-memory registry and request log (no MLflow, no gateway)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from unit.monitoring.rows import Pair, Row

from core.errors import RolloutError
from monitoring.config import RolloutPolicy
from monitoring.controller import RolloutController
from registry.store import CANARY_WEIGHT_TAG, Deployment, ModelVersion

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
NAME = "chat"


@dataclass
class FakeDeployments:
    """A ``DeploymentRegistry``: versions with tags, aliases, registered-model tags, runs, an audit list."""

    tags: dict[str, dict[str, str]] = field(default_factory=dict)  # version -> tags
    aliases: dict[str, str] = field(default_factory=dict)
    model_tags: dict[str, str] = field(default_factory=dict)
    audit: list[dict[str, Any]] = field(default_factory=list)
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, version: str, *, gated: bool = True, **tags: str) -> None:
        self.tags[version] = {"gate.status": "passed" if gated else "failed", **tags}

    def deployment(self, name: str) -> Deployment:
        return Deployment(name, dict(self.aliases), dict(self.model_tags))

    def get(self, name: str, version: str) -> ModelVersion:
        aliases = tuple(a for a, v in self.aliases.items() if v == version)
        return ModelVersion(name, version, None, "src", dict(self.tags[version]), aliases)

    def set_alias(self, name: str, alias: str, version: str, *, reason: str, actor: str) -> None:
        self.audit.append({"alias": alias, "from": self.aliases.get(alias), "to": version, "reason": reason})
        self.aliases[alias] = version

    def remove_alias(self, name: str, alias: str, *, reason: str, actor: str) -> str | None:
        previous = self.aliases.pop(alias, None)
        if previous is not None:
            self.audit.append({"alias": alias, "from": previous, "to": None, "reason": reason})
        return previous

    def set_tags(self, name: str, version: str, tags: dict[str, str]) -> None:
        self.tags[version].update(tags)

    def delete_tags(self, name: str, version: str, keys: list[str]) -> None:
        for key in keys:
            self.tags[version].pop(key, None)

    def set_model_tags(self, name: str, tags: dict[str, str]) -> None:
        self.model_tags.update(tags)

    def open_run(self, *, run_name: str, tags: dict[str, str], params: dict[str, Any] | None = None) -> str:
        run_id = f"run-{len(self.runs)}"
        self.runs[run_id] = {"name": run_name, "tags": dict(tags), "metrics": [], "status": "RUNNING"}
        return run_id

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int) -> None:
        self.runs[run_id]["metrics"].append((step, metrics))

    def set_run_tags(self, run_id: str, tags: dict[str, str]) -> None:
        self.runs[run_id]["tags"].update(tags)

    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        self.runs[run_id]["status"] = status

    @property
    def weight(self) -> int:
        return int(self.model_tags.get(CANARY_WEIGHT_TAG, "0"))


@dataclass
class FakeLog:
    rows: list[Row] = field(default_factory=list)
    pairs: list[Pair] = field(default_factory=list)

    def request_log(self, since: datetime | None = None, model_version: str | None = None, limit: int | None = None):  # type: ignore[no-untyped-def]
        return [r for r in self.rows if since is None or r.at >= since]

    def shadow_log(self, since: datetime | None = None, shadow_version: str | None = None, limit: int | None = None):  # type: ignore[no-untyped-def]
        return [p for p in self.pairs if since is None or p.at >= since]

    def traffic(self, at: datetime, version: str, n: int, **fields: Any) -> None:
        for i in range(n):
            self.rows.append(Row(at=at + timedelta(milliseconds=i), model_version=version, **fields))


POLICY = RolloutPolicy(
    steps=[50],
    shadow_min_samples=10,
    min_samples=20,
    min_latency_samples=10,
    passes_to_advance=1,
    failure_limit=2,
    watch_s=60,
)


@pytest.fixture
def world(tmp_path: Path) -> tuple[FakeDeployments, FakeLog, RolloutController]:
    reg = FakeDeployments()
    reg.add("1")
    reg.add("2")
    reg.aliases["champion"] = "1"
    reg.model_tags["rollout.champion"] = "1"
    requests = FakeLog()
    ctl = RolloutController(reg, requests, POLICY, NAME, actor="test", decisions_path=tmp_path / "decisions.jsonl")
    return reg, requests, ctl


def _good_window(log: FakeLog, at: datetime, canary: str = "chat/2", n: int = 40) -> None:
    log.traffic(at, "chat/1", n)
    log.traffic(at, canary, n, route="canary")


def test_ungated_challenger_loses_the_alias_with_a_reason(world: Any) -> None:
    reg, _, ctl = world
    reg.add("3", gated=False)
    reg.aliases["challenger"] = "3"
    [d] = ctl.tick(T0)
    assert d.action == "reject" and "no passing gate record" in d.reason
    assert "challenger" not in reg.aliases and "no passing gate record" in reg.tags["3"]["rollout.rejected"]
    assert reg.audit[-1]["alias"] == "challenger" and reg.audit[-1]["to"] is None


def test_ungated_champion_set_by_hand_is_reverted(world: Any) -> None:
    reg, _, ctl = world
    reg.add("3", gated=False)
    reg.aliases["champion"] = "3"
    [d] = ctl.tick(T0)
    assert d.action == "revert" and reg.aliases["champion"] == "1"
    assert "no passing gate record" in reg.tags["3"]["rollout.rejected"]


def test_a_gated_champion_set_by_hand_is_accepted(world: Any) -> None:
    reg, _, ctl = world
    reg.aliases["champion"] = "2"
    [d] = ctl.tick(T0)
    assert d.action == "accept" and reg.aliases["champion"] == "2" and reg.model_tags["rollout.champion"] == "2"


def test_without_a_champion_the_first_gated_version_is_promoted_directly(tmp_path: Path) -> None:
    reg = FakeDeployments()
    reg.add("1")
    reg.aliases["challenger"] = "1"
    ctl = RolloutController(reg, FakeLog(), POLICY, NAME, actor="t", decisions_path=tmp_path / "d.jsonl")
    [d] = ctl.tick(T0)
    assert d.action == "promote" and reg.aliases == {"champion": "1"}


def test_good_challenger_goes_shadow_canary_champion_and_finishes_the_watch(world: Any) -> None:
    reg, log, ctl = world
    reg.aliases["challenger"] = "2"
    [d] = ctl.tick(T0)
    assert d.action == "start" and reg.aliases["shadow"] == "2" and reg.weight == 0
    assert reg.tags["2"]["rollout.phase"] == "shadow"
    # too few shadow pairs: hold, never advance
    log.pairs += [Pair(T0 + timedelta(seconds=1), "chat/1", "chat/2") for _ in range(3)]
    [d] = ctl.tick(T0 + timedelta(seconds=60))
    assert d.action == "hold" and reg.weight == 0
    log.pairs += [Pair(T0 + timedelta(seconds=61), "chat/1", "chat/2") for _ in range(20)]
    [d] = ctl.tick(T0 + timedelta(seconds=120))
    assert d.action == "advance" and "shadow" not in reg.aliases and reg.weight == 50
    _good_window(log, T0 + timedelta(seconds=121))
    [d] = ctl.tick(T0 + timedelta(seconds=180))
    assert d.action == "promote"
    assert reg.aliases["champion"] == "2" and reg.aliases["previous-champion"] == "1"
    assert "challenger" not in reg.aliases and reg.weight == 0
    assert reg.tags["2"]["rollout.phase"] == "watch"
    log.traffic(T0 + timedelta(seconds=181), "chat/2", 40)
    [d] = ctl.tick(T0 + timedelta(seconds=250))
    assert d.action == "finish" and reg.tags["2"]["rollout.status"] == "promoted"
    assert "rollout.phase" not in reg.tags["2"]
    run = reg.runs[reg.tags["2"]["rollout.run_id"]]
    assert run["status"] == "FINISHED" and len(run["metrics"]) == 4


def test_canary_that_cannot_answer_is_rolled_back_at_once_and_quarantined(world: Any) -> None:
    reg, log, ctl = world
    reg.aliases["challenger"] = "2"
    ctl.tick(T0)
    log.pairs += [Pair(T0 + timedelta(seconds=1), "chat/1", "chat/2") for _ in range(20)]
    ctl.tick(T0 + timedelta(seconds=60))
    assert reg.weight == 50
    # every request assigned to the canary was answered by the champion: its engine is gone
    log.traffic(T0 + timedelta(seconds=61), "chat/1", 30)
    log.traffic(T0 + timedelta(seconds=61), "chat/1", 25, assigned_version="chat/2", route="canary-unavailable")
    [d] = ctl.tick(T0 + timedelta(seconds=120))
    assert d.action == "rollback" and "success_rate" in d.reason
    assert reg.weight == 0 and "challenger" not in reg.aliases and reg.aliases["champion"] == "1"
    tags = reg.tags["2"]
    assert tags["rollout.quarantined"] == "true" and tags["rollout.status"] == "rolled-back"
    assert "success_rate" in tags["rollout.failing"] and "canary" in tags["rollout.metrics"]
    # quarantined: a reviewer setting the alias again is refused
    reg.aliases["challenger"] = "2"
    [d] = ctl.tick(T0 + timedelta(seconds=180))
    assert d.action == "reject" and "quarantined" in d.reason and "challenger" not in reg.aliases


def _safety_hits(log: FakeLog, at: datetime) -> None:
    log.traffic(at, "chat/1", 60)
    log.traffic(at, "chat/2", 30, route="canary")
    log.traffic(at, "chat/2", 30, route="canary", status="content_filter", post_filter="toxicity")


def _rated_down(log: FakeLog, at: datetime) -> None:
    log.traffic(at, "chat/1", 54, feedback_rating=1)
    log.traffic(at, "chat/1", 6, feedback_rating=-1)
    log.traffic(at, "chat/2", 30, route="canary", feedback_rating=1)
    log.traffic(at, "chat/2", 30, route="canary", feedback_rating=-1)  # healthy answers users dislike


@pytest.mark.parametrize(
    ("traffic", "failing"),
    [
        pytest.param(_safety_hits, "safety_hit_rate", id="more-safety-hits"),
        pytest.param(_rated_down, "thumbs_down_rate", id="users-rate-it-down"),
    ],
)
def test_a_regressing_canary_fails_twice_and_is_rolled_back(
    world: Any, traffic: Callable[[FakeLog, datetime], None], failing: str
) -> None:
    reg, log, ctl = world
    reg.aliases["challenger"] = "2"
    ctl.tick(T0)
    log.pairs += [Pair(T0 + timedelta(seconds=1), "chat/1", "chat/2") for _ in range(20)]
    ctl.tick(T0 + timedelta(seconds=60))
    for k in (1, 2):
        traffic(log, T0 + timedelta(seconds=60 * k + 1))
        [d] = ctl.tick(T0 + timedelta(seconds=60 * (k + 1)))
        assert d.action == ("hold" if k == 1 else "rollback"), d
    assert reg.weight == 0 and failing in reg.tags["2"]["rollout.failing"].split(",")
    assert failing in reg.tags["2"]["rollout.reason"]


def test_watch_failure_returns_the_champion_alias_to_the_previous_champion(world: Any) -> None:
    reg, log, ctl = world
    reg.aliases["challenger"] = "2"
    ctl.tick(T0)
    log.pairs += [Pair(T0 + timedelta(seconds=1), "chat/1", "chat/2") for _ in range(20)]
    ctl.tick(T0 + timedelta(seconds=60))
    _good_window(log, T0 + timedelta(seconds=61))
    ctl.tick(T0 + timedelta(seconds=120))
    assert reg.aliases["champion"] == "2"
    log.traffic(T0 + timedelta(seconds=121), "chat/2", 40, status="error", ttft_ms=None)
    [d] = ctl.tick(T0 + timedelta(seconds=150))
    assert d.action == "rollback"
    assert reg.aliases["champion"] == "1" and reg.model_tags["rollout.champion"] == "1"
    assert reg.tags["2"]["rollout.quarantined"] == "true"


def test_challenger_removed_by_hand_mid_rollout_stops_it(world: Any) -> None:
    reg, _, ctl = world
    reg.aliases["challenger"] = "2"
    ctl.tick(T0)
    del reg.aliases["challenger"]
    [d] = ctl.tick(T0 + timedelta(seconds=60))
    assert d.action == "abort" and "shadow" not in reg.aliases and reg.weight == 0
    assert reg.tags["2"]["rollout.status"] == "abandoned"


def test_manual_rollback_without_previous_champion_is_a_clear_error(world: Any) -> None:
    reg, _, ctl = world
    with pytest.raises(RolloutError, match="no previous-champion"):
        ctl.rollback(reg.get(NAME, "1"), "manual")


def test_every_decision_is_appended_to_the_decision_log(world: Any) -> None:
    reg, _, ctl = world
    reg.add("3", gated=False)
    reg.aliases["challenger"] = "3"
    ctl.tick(T0)
    reg.aliases["challenger"] = "2"
    ctl.tick(T0 + timedelta(seconds=60))
    assert [d.action for d in ctl.decisions()] == ["reject", "start"]
