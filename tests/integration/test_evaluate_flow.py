"""The Prefect ``evaluate`` flow on the tiny config's LoRA version (an adapter, merged once for evaluation):
the gate decides, records on the version, and publishes the decision as a Prefect Markdown artifact."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.helpers import engine_overrides

from core.home import Home
from flows.config import CONFIG_DIR, load_config


# slow: a tiny fine-tune, a LoRA merge and an eval (~2 min); the default run gates through the same evaluate flow in
# the e2e `lifecycle run` test (which checks the recorded decision, not the Prefect artifact)
@pytest.mark.slow
def test_evaluate_flow_gates_a_lora_version_and_publishes_the_decision(
    session_home: Home, prefect_harness: None, tmp_path: Path
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.evaluate import evaluate_flow
    from flows.stages import open_registry
    from flows.train import train_flow

    home = Home(tmp_path)  # its own registry: the failed gate removes the candidate alias other tests read
    cfg = load_config(CONFIG_DIR / "tiny.yaml", engine_overrides())
    trained = train_flow(cfg, home)
    assert trained.lineage["method"] == "lora"
    summary = evaluate_flow(cfg, home, f"chat/{trained.version}")
    # tiny.yaml's 12-step LoRA learns too little: blocked on quality, by name
    assert not summary.passed and "quality/bits_per_byte" in summary.failing
    assert set(summary.seconds_per_suite) == {"quality", "toxicity", "safety", "over_refusal"}
    merged = home.cache / "merged"
    assert any((p / "config.json").is_file() for p in merged.iterdir())  # evaluated as a merged full model
    version = open_registry(cfg, home).get("chat", trained.version)
    assert version.tags["gate.status"] == "failed" and version.tags["gate.run_id"] == summary.run_id
    assert "candidate" not in version.aliases
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["gate-decision"])))
    assert any(str(a.data).startswith(f"# Gate FAILED: chat/{trained.version}") for a in artifacts)
