"""``lifecycle rollout status`` on a fake registry and request log: the window of each version shows its users'
feedback next to the other rates (rated answers, thumbs-down rate; '-' where nobody rated)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from unit.monitoring.test_controller import NAME, POLICY, FakeDeployments, FakeLog

from core.home import Home
from flows.commands.render import status_lines
from flows.config import LifecycleConfig
from flows.rollout import rollout_goes_on, rollout_status, run_serving
from monitoring.controller import RolloutController


def test_the_status_window_shows_rated_answers_and_the_thumbs_down_rate(tmp_path: Path) -> None:
    reg = FakeDeployments()
    reg.add("1")
    reg.aliases["champion"] = "1"
    log = FakeLog()
    ctl = RolloutController(reg, log, POLICY, NAME, actor="test", decisions_path=tmp_path / "decisions.jsonl")
    now = datetime.now(UTC)  # without a rollout the window is the last interval before now
    log.traffic(now - timedelta(seconds=10), "chat/1", 3, feedback_rating=-1)
    log.traffic(now - timedelta(seconds=10), "chat/1", 1, feedback_rating=1)
    log.traffic(now - timedelta(seconds=10), "chat/1", 6)
    status = rollout_status(LifecycleConfig(), Home(tmp_path / "home"), ctl)
    window = status.window["chat/1"]
    assert (window["requests"], window["rated"], window["thumbs_down_rate"]) == (10, 4, 0.75)
    lines = status_lines(status)
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("window"))
    header, row = lines[at].split(), lines[at + 1].split()
    assert header[-2:] == ["rated", "thumbs_down_rate"] and row[-2:] == ["4", "0.750"]


def test_a_rerun_carries_on_a_rollout_an_earlier_run_left_unfinished() -> None:
    # lifecycle run's simulated users play while the controller's first tick leaves a rollout running: one it just
    # started, or one an earlier run left in shadow or canary (a real model's shadow fills slowly on 2 cores)
    assert rollout_goes_on([{"action": "start"}])
    assert rollout_goes_on([{"action": "advance"}]) and rollout_goes_on([{"action": "hold"}])
    assert not rollout_goes_on([]) and not any(
        rollout_goes_on([{"action": a}]) for a in ("promote", "finish", "rollback", "reject")
    )


def test_the_runs_own_gateway_runs_its_engines_as_run_enforce_eager_says() -> None:
    # lifecycle run's gateway lives minutes: run.enforce_eager may run it eager while lifecycle serve stays compiled
    compiled = LifecycleConfig.model_validate({"serving": {"port": 8123, "engine": {"enforce_eager": False}}})
    assert run_serving(compiled).engine.enforce_eager is False and run_serving(compiled).port == 0
    eager = compiled.model_copy(update={"run": compiled.run.model_copy(update={"enforce_eager": True})})
    served = run_serving(eager)
    assert served.engine.enforce_eager is True and served.port == 0
    assert eager.serving.engine.enforce_eager is False  # the config lifecycle serve reads is untouched
    assert served.engine.model_dump(exclude={"enforce_eager"}) == eager.serving.engine.model_dump(
        exclude={"enforce_eager"}
    )
