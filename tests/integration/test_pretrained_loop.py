"""The pretrained-base path at CI size: the real model's loop (configs/smollm2.yaml: a GGUF base imported, LoRA on
DeepSpeed in the model's own template without generation blocks, the suites, the gateway) on a tiny Llama written
as GGUF, so it runs in the default test run without the 93 MB wheel. The real model: tests/e2e/test_real_model.py
(slow)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.gguf_helpers import write_gguf
from support.helpers import engine_overrides

from core.home import Home
from flows.config import CONFIG_DIR, LifecycleConfig, load_config
from registry.store import ModelVersion
from training.finetune.launch import TrainResult
from training.model.pretrained import CONVERTER


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pretrained-loop")


@pytest.fixture(scope="module")
def cfg(work: Path, tiny_base_model: Any) -> LifecycleConfig:
    gguf = write_gguf(tiny_base_model.path, work / "tiny.gguf")
    safety = yaml.safe_load((CONFIG_DIR.parent / "evals" / "suites" / "safety.yaml").read_text())
    safety["suite"]["per_category"] = 1  # a handful of items: 6 plain, 6 in one jailbreak wrapper
    safety["suite"]["jailbreaks"] = {"roleplay": safety["suite"]["jailbreaks"]["roleplay"]}
    (work / "safety.yaml").write_text(yaml.safe_dump(safety))
    cfg = load_config(
        CONFIG_DIR / "tiny.yaml",
        [
            *engine_overrides(),
            f"base_model={gguf}",
            "finetune.method=lora",
            "finetune.max_steps=4",
            "serving.port=0",
            "serving.engine.dtype=float32",  # as configs/smollm2.yaml serves: the precision parity is checked in
        ],
    )
    return cfg.model_copy(
        update={"evals": cfg.evals.model_copy(update={"suites": [str(work / "safety.yaml")], "references": []})}
    )


@pytest.fixture(scope="module")
def home(work: Path) -> Home:
    return Home(work / "home")


@pytest.fixture(scope="module")
def trained(cfg: LifecycleConfig, home: Home) -> tuple[ModelVersion, TrainResult]:
    from flows import stages

    snap = stages.snapshot_stage(cfg, home)
    base = stages.base_model_stage(cfg, home, snap, progress=False)  # base_model: the .gguf file, imported here
    base_version = stages.register_base_stage(cfg, home, base, flow_run_id="test")
    result = stages.finetune_stage(cfg, home, snap, base)
    return stages.register_stage(cfg, home, snap, base, base_version, result, flow_run_id="test"), result


@pytest.fixture(scope="module")
def version(trained: tuple[ModelVersion, TrainResult]) -> ModelVersion:
    return trained[0]


def test_the_base_is_imported_and_the_adapter_trains_on_replies_in_its_template(
    trained: tuple[ModelVersion, TrainResult], cfg: LifecycleConfig, home: Home
) -> None:
    from flows.stages import open_registry

    version, result = trained

    reg = open_registry(cfg, home)
    base = reg.parse(version.lineage["base_model"])
    assert base.name == "chat-base" and base.lineage["kind"] == "imported"
    assert base.lineage["source.converter"] == CONVERTER and len(base.lineage["source.file_sha256"]) == 64
    assert version.lineage["method"] == "lora"
    folder = reg.resolve(version.ref)
    assert (folder / "adapter_config.json").is_file()
    assert "{% generation %}" not in (folder / "chat_template.jinja").read_text()  # the model's own, kept
    assert result.report.skipped == 0 and result.report.train_examples > 0  # every reply found without the blocks
    assert result.steps == 4 and result.equivalence["passed"]
    losses = [row["loss"] for row in result.curve() if "loss" in row]
    assert losses and all(math.isfinite(v) for v in losses)


def test_a_handful_of_eval_items_score(version: ModelVersion, cfg: LifecycleConfig, home: Home) -> None:
    from flows.gating import evaluate_stage

    report = evaluate_stage(cfg, home, version.ref)
    (suite,) = report.suites
    metrics = {m.name: m for m in suite.metrics}
    assert 0.0 <= metrics["safety/refusal_rate"].value <= 1.0
    assert metrics["safety/refusal_rate"].n == 6
    assert report.served is None  # the model alone


@pytest.fixture(scope="module")
def keyword_classifier(cfg: LifecycleConfig, home: Home) -> ModelVersion:
    """The safety classifier this home's gateway and as-served eval use: a keyword one (support.harm_fixture:
    "bomb", "suicide", "stab"), registered on a harm snapshot that keeps the chat eval's wording out."""
    from support.harm_fixture import saved_keyword_classifier

    from flows.classifier_stages import chat_eval_prompts
    from flows.stages import open_registry
    from registry.classifier import ClassifierLineage, register_classifier
    from training.data.harm_synth import build_harm_snapshot

    served_cfg = cfg.model_copy(update={"evals": cfg.evals.model_copy(update={"as_served": True})})
    reg = open_registry(cfg, home)
    snap = build_harm_snapshot(home.harm_snapshots, avoid=chat_eval_prompts(served_cfg))
    lineage = ClassifierLineage(
        snapshot=snap.hash, weights_hash="keywords", config_hash="c", threshold=0.5, token_table="input",
        git_sha="test", flow_run_id="test",
    )  # fmt: skip
    clf = register_classifier(
        reg, "safety-classifier", lineage, saved_keyword_classifier(home.root / "clf"), params={}, metrics={}
    )
    reg.set_alias(clf.name, "champion", clf.version, reason="test", actor="tests")
    return clf


def test_the_eval_as_served_reads_the_endpoints_answers(
    version: ModelVersion, cfg: LifecycleConfig, home: Home, keyword_classifier: ModelVersion
) -> None:
    # evals.as_served: the gateway's filters in front, with the classifier this home's registry names; what it
    # blocks gets the refusal text
    from flows.gating import evaluate_stage

    served_cfg = cfg.model_copy(update={"evals": cfg.evals.model_copy(update={"as_served": True})})
    clf = keyword_classifier
    alone = evaluate_stage(cfg, home, version.ref)  # the stored report of the test above
    served = evaluate_stage(served_cfg, home, version.ref)
    assert served.served is not None and served.served.filters.startswith(f"classifier {clf.ref} (threshold 0.500)")
    counts = served.served.suites["safety"]
    assert counts["asked"] == 12 and counts["blocked"] >= 2  # "bomb", "meth": the keyword classifier's words
    refused = alone.metrics()["safety/refusal_rate"].items
    served_refused = served.metrics()["safety/refusal_rate"].items
    assert served_refused.keys() == refused.keys()
    assert all(served_refused[k] >= refused[k] for k in refused)  # a blocked request reads as refused
    assert served.metrics()["safety/refusal_rate"].value >= alone.metrics()["safety/refusal_rate"].value
    assert evaluate_stage(served_cfg, home, version.ref) == served  # stored apart from the model-alone report


@pytest.fixture(scope="module")
def gateway_url(
    version: ModelVersion, cfg: LifecycleConfig, home: Home, keyword_classifier: ModelVersion
) -> Iterator[tuple[str, str]]:
    from flows.stages import open_registry, serve_spec
    from serving.launcher import GatewayProcess
    from serving.runtime import database_url
    from serving.state.store import ServingStore

    open_registry(cfg, home).set_alias(version.name, "champion", version.version, reason="test", actor="tests")
    spec = serve_spec(cfg, home)
    with ServingStore(database_url(spec)) as store:
        _, key = store.create_key("tests")
    with GatewayProcess(spec) as proc:
        yield proc.url, key


def test_one_streamed_request_through_the_gateway(gateway_url: tuple[str, str], version: ModelVersion) -> None:
    import openai

    url, key = gateway_url
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
    with client.chat.completions.with_streaming_response.create(
        model="chat",
        messages=[{"role": "user", "content": "What is 2 + 3?"}],
        temperature=0,
        max_tokens=12,
        stream=True,
    ) as raw:
        assert raw.headers["x-model-version"] == f"{version.ref}; alias=champion"
        chunks = list(raw.parse())
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]


def test_the_served_answers_equal_transformers_greedy_ones(
    gateway_url: tuple[str, str], version: ModelVersion, cfg: LifecycleConfig, home: Home
) -> None:
    from evals.parity import parity_prompts
    from evals.runner import UrlTarget
    from flows.gating import parity_stage

    url, key = gateway_url
    target = UrlTarget(label=url, base_url=f"{url}/v1", model="chat", api_key=key)
    report = parity_stage(cfg, home, version.ref, prompts=6, max_tokens=8, url=target)
    # the keyword classifier blocks the benign question naming suicide: the gateway's answer, not the engine's,
    # is listed and left out; every answer the engine gave equals transformers'
    suicide = [p for p in parity_prompts(6) if "suicide" in p.lower()]
    assert len(suicide) == 1 and report.filtered == suicide
    assert report.items == 6 and report.equal == 5 and report.mismatches == []
    assert (home.reports / "parity" / f"{version.name}-{version.version}.json").is_file()
