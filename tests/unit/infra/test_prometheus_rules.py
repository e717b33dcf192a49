"""infra/prometheus's rules against Prometheus' own tools: ``promtool check rules`` (syntax, PromQL) and
``promtool test rules`` (tests/alerts_test.yml: input series in the gateway's metric names, the recording rules'
values and the alerts that must and must not fire) and ``promtool check config`` on the stack's prometheus.yml.
The rules running for real against a gateway: tests/e2e/test_champion_watch.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from serving.pipeline.metrics import ServingMetrics

REPO = Path(__file__).resolve().parents[3]
PROM = REPO / "infra" / "prometheus"
RULES = [PROM / "recording.yml", PROM / "alerts.yml"]
needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool is not installed (scripts/install-services.sh: prometheus)"
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, cwd=REPO)


@needs_promtool
def test_rule_files_pass_promtool_check() -> None:
    done = promtool("check", "rules", *map(str, RULES))
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_alert_rule_unit_tests_pass() -> None:
    done = promtool("test", "rules", str(PROM / "tests" / "alerts_test.yml"))
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_a_wrong_expectation_fails_the_unit_tests(tmp_path: Path) -> None:
    # the unit tests compare values: a changed threshold in alerts.yml must break them
    alerts = (
        (PROM / "alerts.yml")
        .read_text()
        .replace("lifecycle:abort_ratio:rate5m > 0.10", "lifecycle:abort_ratio:rate5m > 0.5")
    )
    (tmp_path / "alerts.yml").write_text(alerts)
    (tmp_path / "recording.yml").write_text((PROM / "recording.yml").read_text())
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "alerts_test.yml").write_text((PROM / "tests" / "alerts_test.yml").read_text())
    done = promtool("test", "rules", str(tmp_path / "tests" / "alerts_test.yml"))
    assert done.returncode != 0 and "AbortRatioHigh" in done.stdout + done.stderr


@needs_promtool
def test_stack_prometheus_config_is_valid() -> None:
    done = promtool("check", "config", "--syntax-only", str(PROM / "prometheus.yml"))
    assert done.returncode == 0, done.stdout + done.stderr


def test_rules_read_only_metrics_the_gateway_exports() -> None:
    exported = {m.name for m in ServingMetrics().registry.collect()}
    exported.add("up")  # Prometheus' own, per scrape target
    text = "\n".join(r.read_text() for r in RULES)
    used = set(re.findall(r"\b(lifecycle_[a-z_]+|up)\b(?=\s*[{\[)=<>]|\s*$)", text, re.M))
    assert {"lifecycle_ttft_seconds_bucket", "lifecycle_requests_total", "up"} <= used
    for name in used:
        base = re.sub(r"_(total|bucket|sum|count)$", "", name)
        assert base in exported, f"{name}: no such family on the gateway's /metrics"


def test_every_alert_has_a_severity_and_a_signal_the_watch_knows() -> None:
    rules = yaml.safe_load((PROM / "alerts.yml").read_text())["groups"][0]["rules"]
    assert rules
    for rule in rules:
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        assert rule["labels"]["signal"] in {"slo", "safety", "availability", "quality"}, rule["alert"]
