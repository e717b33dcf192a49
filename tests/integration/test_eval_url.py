"""The suites against an OpenAI-compatible URL: vLLM's own OpenAI server on 127.0.0.1, lm-eval's
``local-chat-completions`` for quality and the official ``openai`` client for the behaviour suites. Greedy suites
must give the same answers as the in-process engine on the same weights. Slow: a second engine start (~1 min)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from core.home import Home
from core.process import free_port
from evals.config import EvalConfig, load_suite
from evals.runner import ModelTarget, UrlTarget, run_eval
from evals.sets import build_eval_sets

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tiny_base_model, session_home: Home, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    port = free_port()
    log = (tmp_path_factory.mktemp("vllm-server") / "server.log").open("w")
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_base_model.path)]
    cmd += ["--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32"]
    cmd += ["--seed", "1234", "--enforce-eager", "--max-num-seqs", "64"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            assert proc.poll() is None, Path(log.name).read_text()[-3000:]
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        else:
            pytest.fail("vLLM server did not start in 300 s")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def test_url_target_matches_the_in_process_engine(
    server, tiny_base_model, tiny_snapshot, tiny_config, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    suites = [load_suite(s) for s in ("quality", "safety", "over_refusal")]
    sets = build_eval_sets(tiny_snapshot, tiny_config.data.generator, suites, seed=1, root=tmp_path)
    cfg = EvalConfig()
    remote = run_eval(cfg, UrlTarget(label="url", base_url=server, model="tiny"), sets, suites)
    local = run_eval(cfg, ModelTarget(label="folder", model_id="tiny", folder=tiny_base_model.path), sets, suites)
    quality = next(s for s in remote.suites if s.name == "quality")
    assert quality.details["tasks"] == ["chat_exact"]  # the chat API has no prompt loglikelihoods
    assert quality.details["skipped_tasks"] == ["chat_choice", "chat_perplexity"]
    r, lo = remote.metrics(), local.metrics()
    for name in ("quality/exact_match", "safety/refusal_rate", "over_refusal/compliance_rate"):
        assert r[name].items == lo[name].items, name  # greedy: the same answers, item by item


def test_completions_api_runs_every_quality_task(
    server, tiny_base_model, tiny_snapshot, tiny_config, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    suites = [load_suite("quality")]
    sets = build_eval_sets(tiny_snapshot, tiny_config.data.generator, suites, seed=1, root=tmp_path)
    target = UrlTarget(
        label="url", base_url=server, model="tiny", api="completions", tokenizer=str(tiny_base_model.path)
    )
    remote = run_eval(EvalConfig(), target, sets, suites)
    local = run_eval(EvalConfig(), ModelTarget(label="f", model_id="t", folder=tiny_base_model.path), sets, suites)
    r, lo = remote.metrics(), local.metrics()
    assert remote.suites[0].details["skipped_tasks"] == []
    assert r["quality/exact_match"].items == lo["quality/exact_match"].items
    assert r["quality/choice_acc"].items == lo["quality/choice_acc"].items
    assert r["quality/bits_per_byte"].value == pytest.approx(lo["quality/bits_per_byte"].value, rel=1e-3)
