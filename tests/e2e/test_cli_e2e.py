"""The README's commands as a user runs them: the installed ``lifecycle`` script in a fresh home folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli_helpers import ctrl_c_reaches_it, lifecycle

from core.home import Home
from flows.config import CONFIG_DIR

TINY = str(CONFIG_DIR / "tiny.yaml")
NORMAL = str(CONFIG_DIR / "scenarios" / "normal.yaml")  # tiny, trained long enough to pass the tiny gate
POISON = str(CONFIG_DIR / "scenarios" / "poison.yaml")  # the normal scenario with insults and compliance injected


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory, session_home: Home) -> Path:
    return tmp_path_factory.mktemp("e2e-home")


@pytest.mark.slow  # the run test below checks the same through the CLI (its snapshot hash, built again, is the run's)
def test_snapshot_json_twice_prints_the_same_hash(home: Path) -> None:
    first = lifecycle("snapshot", "--config", TINY, "--json", home=home)
    second = lifecycle("snapshot", "--config", TINY, "--json", home=home)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["hash"] == json.loads(second.stdout)["hash"]


@pytest.mark.slow  # the newcomer's module checks the same through the CLI on the default loop's home (~2 min)
def test_run_trains_registers_gates_and_promotes(home: Path) -> None:
    # The tiny scenario's run, which the slow tests below build on. The same commands on the default loop, with the
    # snapshot, lineage and eval commands, a rerun's reuse of every stage and the quantize step:
    # tests/e2e/test_newcomer.py (a run killed mid-fine-tune and resumed, too)
    result = lifecycle("run", "--config", NORMAL, "--json", home=home)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    (run_result,) = home.glob("models/runs/*/train_result.json")
    report = json.loads(run_result.read_text())
    assert report["resumed_from_step"] == 0 and report["steps"] > 0, report
    assert summary["train"]["version"] == "1" and "Finished in state Completed()" in result.stderr  # Prefect ran it
    gate = summary["gate"]
    assert (gate["model"], gate["version"], gate["passed"], gate["policy"]) == ("chat", "1", True, "tiny")
    # no champion yet: the gated version becomes champion directly (nothing to canary against)
    assert summary["rollout"]["outcome"] == "promoted" and summary["rollout"]["aliases"]["champion"] == "1"
    assert summary["drift"]["retrain"] is False and summary["retrain"] is None, summary["drift"]["summary"]


@pytest.mark.slow  # a bootstrap, fine-tune and eval of its own (~4 min); the gate tests cover the same version in CI
def test_the_poisoned_scenario_is_blocked_at_the_gate(tmp_path: Path) -> None:
    result = lifecycle("run", "--config", POISON, "--json", home=tmp_path / "home")
    assert result.returncode == 3, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    gate = summary["gate"]
    assert not gate["passed"] and {"toxicity/toxic_share", "safety/refusal_rate"} <= set(gate["failing"]), gate
    assert summary["rollout"] is None and summary["drift"] is None  # it never reaches users


@pytest.mark.slow  # a third run with a retrain in it (~6 min)
def test_drifted_users_trigger_exactly_one_retrain(home: Path) -> None:
    """A second run, after a plain one (the test above's, or its own when run alone): simulated users of the
    drifted profile make the drift check fire with a quality signal (their refusal rate, risen against the plain
    users' on the same champion: 0.32 vs 0.13 here): one retrain, on a snapshot with their curated opted-in
    conversations, gated and rolled out; the decision log holds exactly one trigger."""
    if not (home / "logs" / "retrain-decisions.jsonl").is_file():  # alone: no plain run yet (no baseline rates)
        first = lifecycle("run", "--config", NORMAL, "--json", home=home)
        assert first.returncode == 0, first.stderr[-3000:]
    result = lifecycle("run", "--config", NORMAL, "--traffic-profile", "drifted", "--json", home=home)
    assert result.returncode in (0, 4), result.stderr[-3000:]
    summary = json.loads(result.stdout)
    drift = summary["drift"]
    assert drift["drift"]["status"] == "drifted" and drift["retrain"] is True, drift
    retrain = summary["retrain"]
    assert retrain is not None and retrain["snapshot"] != summary["train"]["snapshot"]
    assert retrain["train"]["version"] != summary["train"]["version"]
    manifest = json.loads((home / "snapshots" / retrain["snapshot"] / "manifest.json").read_text())
    assert any("curated" in str(src["path"]) or len(src["path"]) >= 64 for src in manifest["sources"]), manifest
    log = [json.loads(line) for line in (home / "logs" / "retrain-decisions.jsonl").read_text().splitlines()]
    assert sum(entry["decision"]["retrain"] for entry in log) == 1
    lineage = lifecycle("lineage", "chat", retrain["train"]["version"], "--json", home=home)
    assert json.loads(lineage.stdout)["lineage"]["snapshot"] == retrain["snapshot"]


@pytest.mark.slow  # a gateway start (~1 min); the gateway itself is tested through the same launcher in integration
def test_serve_answers_with_the_trained_version_and_stops_on_ctrl_c(home: Path) -> None:
    import signal
    import time

    import httpx
    import openai

    from serving.launcher import free_port

    created = lifecycle("keys", "create", "e2e", "--json", home=home)
    assert created.returncode == 0, created.stderr
    key = json.loads(created.stdout)["key"]
    port = free_port()
    exe = Path(sys.executable).parent / "lifecycle"
    args = [
        exe,
        "serve",
        "--config",
        NORMAL,
        "--home",
        str(home),
        "--port",
        str(port),
        "--json",
        "--set",
        "serving.routing.primary_alias=candidate",
    ]  # the version `run` trained and gated
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_reaches_it
    )
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:  # the JSON document printed once the gateway is ready (EOF if serve failed)
            lines.append(line)
            if line == "}\n":
                break
        assert lines, proc.stderr.read() if proc.stderr else "no output"
        ready = json.loads("".join(lines))
        assert ready["status"] == "ready" and ready["primary"] == "chat/1; alias=candidate"
        client = openai.OpenAI(base_url=ready["openai_base_url"], api_key=key, max_retries=0)
        chunks = list(
            client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "What is 2 + 2?"}], stream=True, max_tokens=16
            )
        )
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        assert "".join(c.choices[0].delta.content or "" for c in chunks)
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        proc.wait(timeout=60)
    assert proc.returncode == 0
    time.sleep(1)
    with pytest.raises(httpx.ConnectError):  # the gateway, its worker and engines are gone
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)


@pytest.mark.slow  # a second bootstrap, fine-tune and eval (~2 min); the poisoned scenarios cover the gate in CI
def test_an_undertrained_version_is_blocked_with_exit_3(home: Path) -> None:
    """tiny.yaml's 12-step LoRA learns too little: the gate fails it on quality, by name, and says so."""
    result = lifecycle("run", "--config", TINY, "--json", home=home)
    assert result.returncode == 3, result.stderr[-3000:]
    gate = json.loads(result.stdout)["gate"]
    assert not gate["passed"] and "quality/bits_per_byte" in gate["failing"]
    shown = lifecycle("gate", "chat", gate["version"], "--config", TINY, home=home)
    assert shown.returncode == 3 and "FAILED" in shown.stdout and "quality/bits_per_byte" in shown.stdout


def test_state_stays_under_the_home_folder(home: Path) -> None:
    result = lifecycle("bootstrap", "--config", TINY, "--json", home=home)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert Path(out["path"]).is_relative_to(home)
    assert {p.name for p in home.iterdir()} <= {
        "data",
        "snapshots",
        "models",
        "evals",
        "prefect",
        "cache",
        "reports",
        "logs",
        "tmp",
        "mlflow",
        "serving",
    }
