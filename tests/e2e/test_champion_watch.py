"""The champion watch end to end: a real Prometheus scrapes a real gateway (``bentoml serve`` + vLLM) every
second with the product's rules (infra/prometheus; only the ``for:`` durations shortened), a real Alertmanager
(infra/alertmanager/alertmanager.yml, its waits shortened) posts to ``lifecycle watch``'s receiver, and the watch
rolls the freshly promoted, slowed champion back to previous-champion while simulated users keep talking.

chat/1 was champion; chat/2 (the same LoRA weights under another hash) was just promoted over it and is slowed by
``serving.faults`` (1.5 s before its first token, over the rules' 1 s TTFT SLO). The TTFT alert fires about
chat/2, the watch records it on chat/2 and rolls back; the gateway follows the registry to chat/1; no request
of the users fails on the way.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from support import rollout_helpers
from support.rollout_helpers import RolloutWorld, engines_ready, registered_base, rollout_world
from support.stack_helpers import wait_for

from core.process import ServerProcess, free_port
from flows.config import LifecycleConfig

REPO = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
SLOW_MS = 1500  # over the 1 s TTFT threshold of infra/prometheus/alerts.yml
pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("prometheus-alertmanager") is None,
    reason="prometheus or prometheus-alertmanager is not installed (scripts/install-services.sh)",
)


def render_rules(folder: Path) -> None:
    """The product's rule files with every ``for:`` at 2 s: the expressions are the product's own."""
    for name in ("recording.yml", "alerts.yml"):
        text = (REPO / "infra" / "prometheus" / name).read_text()
        (folder / name).write_text(re.sub(r"(?m)^(\s+for:) \S+$", r"\1 2s", text))


def prometheus(folder: Path, gateway: str, alertmanager: str) -> ServerProcess:
    render_rules(folder)
    config = yaml.safe_load((REPO / "infra" / "prometheus" / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(folder / "recording.yml"), str(folder / "alerts.yml")]
    config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = [alertmanager]
    (gateway_job,) = [j for j in config["scrape_configs"] if j["job_name"] == "gateway"]
    gateway_job["static_configs"][0]["targets"] = [gateway]
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    cmd = [
        str(shutil.which("prometheus")),
        f"--config.file={folder / 'prometheus.yml'}",
        f"--storage.tsdb.path={folder / 'data'}",
    ]
    cmd.append(f"--web.listen-address={HOST}:{port}")
    return ServerProcess(
        "prometheus", cmd, log_path=folder / "prometheus.log", health_url=f"http://{HOST}:{port}/-/ready"
    )


def alertmanager(folder: Path, watch_url: str) -> tuple[ServerProcess, str]:
    config = yaml.safe_load((REPO / "infra" / "alertmanager" / "alertmanager.yml").read_text())
    config["route"] |= {"group_wait": "1s", "group_interval": "1s"}
    config["receivers"][0]["webhook_configs"][0]["url"] = watch_url + "/alerts"
    (folder / "alertmanager.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    cmd = [
        str(shutil.which("prometheus-alertmanager")),  # a path: ServerProcess execs it
        f"--config.file={folder / 'alertmanager.yml'}",
        f"--storage.path={folder / 'am-data'}",
        f"--web.listen-address={HOST}:{port}",
        "--cluster.listen-address=",  # no gossip port: a single instance
    ]
    health = f"http://{HOST}:{port}/-/ready"
    return ServerProcess("alertmanager", cmd, log_path=folder / "alertmanager.log", health_url=health), f"{HOST}:{port}"


@pytest.fixture(scope="module")
def world(
    tiny_config: LifecycleConfig, tiny_base_model: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RolloutWorld]:
    from flows.traffic import traffic_prompts

    r = registered_base(tiny_config, tiny_base_model, tmp_path_factory, "watch-home")
    home, reg = r.home, r.reg
    r.add("")  # chat/1
    r.add("-slow")  # chat/2
    # chat/2 promoted over chat/1 just now, as the controller's promotion leaves it
    reg.set_alias("chat", "previous-champion", "1", reason="replaced by chat/2", actor="tests")
    reg.set_alias("chat", "champion", "2", reason="promoted by the test", actor="tests")
    reg.set_model_tags("chat", {"rollout.champion": "2"})
    prompts = traffic_prompts(tiny_config.data.generator, "normal", 200)
    serving = {"faults": [{"version": "chat/2", "ttft_delay_ms": SLOW_MS}]}
    with rollout_world(tiny_config, home, rollout_helpers.POLICY, prompts, serving) as world:
        yield world


def test_slowed_champion_fires_the_alert_and_is_rolled_back_without_losing_a_request(
    world: RolloutWorld, tmp_path: Path
) -> None:
    from flows.watch import open_watch, running_watch
    from monitoring.controller import read_decisions

    reports: list[Any] = []
    rolled_back = threading.Event()

    def users() -> None:  # batches of simulated users until one batch after the rollback
        offset = 0
        while not rolled_back.is_set():
            reports.append(world.traffic(8, concurrency=4, offset=offset))
            offset += 8
        world.wait_deployment(lambda d, b: d.get("champion") == "chat/1" and engines_ready(b))
        reports.append(world.traffic(8, concurrency=4, offset=offset))

    gateway = world.url.removeprefix("http://")
    with running_watch(open_watch(world.cfg, world.home, actor="tests"), HOST, 0) as watch_url:
        am, am_address = alertmanager(tmp_path, watch_url)
        with am, prometheus(tmp_path, gateway, am_address) as prom:
            thread = threading.Thread(target=users, name="users")
            thread.start()
            try:
                champion = wait_for(
                    "the watch's rollback",
                    lambda: world.registry().deployment("chat").aliases.get("champion") == "1",
                    timeout_s=300,
                )
                assert champion
            finally:
                rolled_back.set()
                thread.join()
            # the alert as Prometheus evaluated it: about chat/2, from the product's expression
            rules = httpx.get(f"{prom.health_url.removesuffix('/-/ready')}/api/v1/alerts", timeout=10).json()
            fired = [a for a in rules["data"]["alerts"] if a["labels"]["alertname"] == "TtftP95OverSlo"]
            assert fired and fired[0]["labels"]["model_version"] == "chat/2"

    reg = world.registry()
    slow = reg.get("chat", "2")
    assert slow.tags["rollout.quarantined"] == "true"
    assert "champion watch: TtftP95OverSlo" in slow.tags["rollout.quarantine_reason"]
    assert json.loads(slow.tags["watch.alert.TtftP95OverSlo"])["action"] == "rollback"
    assert "rollback of chat/2: champion watch" in reg.get("chat", "1").tags["alias.champion.reason"]
    actions = [d.action for d in read_decisions(world.home.decision_log("rollout"), "chat")]
    assert "alert" in actions and "rollback" in actions
    # no request lost: every user got an answer, first from chat/2, at the end from chat/1
    assert reports and all(r.ok == r.sent and not r.errors for r in reports), [r.summary() for r in reports]
    assert any(v.startswith("chat/2") for v in reports[0].by_version)
    assert all(v.startswith("chat/1") for v in reports[-1].by_version), reports[-1].summary()
