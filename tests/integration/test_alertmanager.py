"""The daily champion eval's alert reaching a real Alertmanager (Debian's prometheus-alertmanager, its config from
infra/alertmanager with the receiver pointed at a closed port): a drop beyond ``monitoring.watch.eval_drop`` since
the last daily eval posts ChampionEvalDrop, a drop within it posts nothing. Its way on to the champion watch is
the same route as Prometheus' alerts (tests/e2e/test_champion_watch.py)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from core.config import deep_merge
from core.process import ServerProcess, free_port
from flows.config import LifecycleConfig
from flows.gating import daily_drops
from registry.store import ModelVersion

REPO = Path(__file__).resolve().parents[2]
AM = shutil.which("prometheus-alertmanager")
pytestmark = pytest.mark.skipif(AM is None, reason="prometheus-alertmanager is not installed (install-services.sh)")


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("alertmanager")
    config = yaml.safe_load((REPO / "infra" / "alertmanager" / "alertmanager.yml").read_text())
    config["receivers"][0]["webhook_configs"][0]["url"] = f"http://127.0.0.1:{free_port()}/alerts"
    (folder / "alertmanager.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    cmd = [str(AM), f"--config.file={folder / 'alertmanager.yml'}", f"--storage.path={folder / 'data'}"]
    cmd += [f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="]
    url = f"http://127.0.0.1:{port}"
    with ServerProcess("alertmanager", cmd, log_path=folder / "am.log", health_url=f"{url}/-/ready"):
        yield url


def champion(version: str, previous: str) -> ModelVersion:
    return ModelVersion("chat", version, None, "src", {"eval.daily.metrics": previous}, ("champion",))


def alerts(url: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = httpx.get(f"{url}/api/v2/alerts", timeout=10).json()
    return found


def test_a_daily_eval_drop_posts_an_alert_and_a_small_one_does_not(
    alertmanager: str, tiny_config: LifecycleConfig
) -> None:
    watch = {"monitoring": {"watch": {"alertmanager_url": alertmanager}}}
    cfg = LifecycleConfig.model_validate(deep_merge(tiny_config.model_dump(mode="json"), watch))
    up: dict[str, bool | None] = {"quality.accuracy": True}
    small = daily_drops(cfg, champion("7", '{"quality.accuracy": 0.8}'), {"quality.accuracy": 0.78}, up)
    assert small == {} and alerts(alertmanager) == []
    drops = daily_drops(cfg, champion("8", '{"quality.accuracy": 0.8}'), {"quality.accuracy": 0.7}, up)
    assert drops == {"quality.accuracy": 0.125}
    (alert,) = alerts(alertmanager)
    assert alert["labels"]["alertname"] == "ChampionEvalDrop" and alert["labels"]["model_version"] == "chat/8"
    assert alert["labels"]["severity"] == "warning" and "quality.accuracy -12.5%" in alert["annotations"]["summary"]
    assert alert["receivers"] == [{"name": "champion-watch"}]


def test_a_drift_verdict_posts_a_warning_for_a_person(alertmanager: str, tiny_config: LifecycleConfig) -> None:
    from flows.signals import _post_drift_alert

    watch = {"monitoring": {"watch": {"alertmanager_url": alertmanager}}}
    cfg = LifecycleConfig.model_validate(deep_merge(tiny_config.model_dump(mode="json"), watch))
    _post_drift_alert(cfg, "chat/9", "embedding drift score 0.31 over 0.1")
    (alert,) = [a for a in alerts(alertmanager) if a["labels"]["alertname"] == "DriftDetected"]
    assert alert["labels"] == {
        "alertname": "DriftDetected",
        "severity": "warning",
        "signal": "drift",
        "model_version": "chat/9",
    }
    assert "embedding drift score 0.31" in alert["annotations"]["summary"]
    assert alert["receivers"] == [{"name": "champion-watch"}]
    # unreachable Alertmanager: the drift check goes on, it only says so
    down = LifecycleConfig.model_validate(
        deep_merge(
            tiny_config.model_dump(mode="json"), {"monitoring": {"watch": {"alertmanager_url": "http://127.0.0.1:9"}}}
        )
    )
    _post_drift_alert(down, "chat/9", "drifted")
