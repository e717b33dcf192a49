"""infra/haproxy/haproxy.cfg against HAProxy's own parser and against the gateway it balances: the names it relies
on (the conversation field, the answer's header, the health route) are the ones the gateway uses, and every error
the balancer answers itself is OpenAI-shaped. The balancer running for real: tests/e2e/test_gateway_replicas.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from serving.wire.protocol import ChatCompletionRequest

REPO = Path(__file__).resolve().parents[3]
CFG = REPO / "infra" / "haproxy" / "haproxy.cfg"
TEXT = CFG.read_text(encoding="utf-8")
SETTINGS = "\n".join(line for line in TEXT.splitlines() if not line.lstrip().startswith("#"))


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed (scripts/install-services.sh)")
def test_haproxy_accepts_the_config_with_its_settings_and_needs_every_one() -> None:
    settings = {"LB_BIND": "127.0.0.1:3000", "GATEWAY_1": "127.0.0.1:3001", "GATEWAY_2": "127.0.0.1:3002"}
    assert set(re.findall(r"\$\{(\w+)\}", SETTINGS)) == set(settings)
    env = {k: v for k, v in os.environ.items() if k not in settings}
    ok = subprocess.run(["haproxy", "-c", "-f", str(CFG)], env={**env, **settings}, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    without = {**env, **settings}
    del without["GATEWAY_2"]
    missing = subprocess.run(["haproxy", "-c", "-f", str(CFG)], env=without, capture_output=True, text=True)
    assert missing.returncode != 0  # an unset replica address is an error, not a silent empty server


def test_affinity_uses_the_gateways_conversation_field_and_header() -> None:
    (field,) = re.findall(r"stick match req\.body,json_query\('\$\.(\w+)'\)", TEXT)
    assert field in ChatCompletionRequest.model_fields
    (header,) = re.findall(r"stick store-response res\.hdr\(([\w-]+)\)", TEXT)
    assert (
        f'"{header}"' in (REPO / "serving" / "pipeline" / "call.py").read_text()
    )  # Call.headers sets it on every answer


def test_health_checks_use_the_readiness_route() -> None:
    (path,) = re.findall(r"option httpchk GET (\S+)", TEXT)
    assert path == "/readyz"
    assert '"/readyz"' in (REPO / "serving" / "api" / "ops.py").read_text()


def test_the_balancers_own_errors_are_openai_shaped() -> None:
    errors = re.findall(r"http-error status (\d+) .*? string '(.*)'$", TEXT, flags=re.MULTILINE)
    assert {status for status, _ in errors} == {"502", "503", "504"}
    for _, body in errors:
        error = json.loads(body)["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "server_error" and error["message"]
