"""Quantized variants (``training.model.quantize``, ``flows.quantization``) on the tiny base model: the W8A8
folder is a compressed-tensors checkpoint of int8 weights whose decompressed logits stay close to the parent's,
it is registered as a chat version whose lineage names its parent and the method (once), the gate judges it
against that parent, and vLLM's CPU backend serves it through our engine (in bf16, which its int8 kernels need)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from core.errors import ModelError
from core.home import Home
from core.quantized import compute_dtype
from flows.config import LifecycleConfig
from registry.store import ModelVersion
from training.config import QuantizeConfig
from training.model.quantize import quantize


@pytest.fixture(scope="module")
def quantized(
    tiny_config: LifecycleConfig, tiny_base_model: Any, tiny_snapshot: Any, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Home, ModelVersion, ModelVersion]:
    from flows.quantization import quantize_stage
    from flows.stages import register_base_stage

    home = Home(tmp_path_factory.mktemp("quant-home"))  # a registry of its own: no other test sees these versions
    shutil.copytree(tiny_snapshot.path, home.snapshots / tiny_snapshot.hash)
    parent = register_base_stage(tiny_config, home, tiny_base_model, flow_run_id="test")
    version = quantize_stage(tiny_config, home, parent.ref, snapshot=tiny_snapshot.hash[:12], flow_run_id="test")
    return home, parent, version


def _folder(home: Home) -> Path:
    from flows.quantization import quantized_root

    (folder,) = [p for p in quantized_root(home).iterdir() if not p.name.startswith(".")]
    return folder


def test_a_w8a8_folder_holds_int8_weights_and_computes_close_to_its_parent(quantized, tiny_base_model) -> None:  # type: ignore[no-untyped-def]
    folder = _folder(quantized[0])
    config = json.loads((folder / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "compressed-tensors" and config["format"] == "int-quantized"
    assert config["ignore"] == ["lm_head"] and compute_dtype(folder) == "bfloat16"
    assert compute_dtype(Path(tiny_base_model.path)) is None
    with safe_open(str(next(folder.glob("*.safetensors"))), "pt") as f:
        dtypes = {k: f.get_tensor(k).dtype for k in f.keys()}  # noqa: SIM118
    assert dtypes["model.layers.0.mlp.down_proj.weight"] == torch.int8
    assert dtypes["model.embed_tokens.weight"] == torch.float32  # embeddings (and the tied head) stay full
    assert (folder / "chat_template.jinja").is_file() or "chat_template" in (
        folder / "tokenizer_config.json"
    ).read_text()
    manifest = json.loads((folder / "lifecycle.json").read_text())
    assert manifest["kind"] == "quantized" and manifest["parent_weights_hash"] == tiny_base_model.identity
    assert 0 < manifest["metrics"]["weight_rel_error"] < 0.05

    parent = AutoModelForCausalLM.from_pretrained(str(tiny_base_model.path), dtype=torch.float32)
    child = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)  # decompressed by transformers
    ids = torch.arange(3, 60).unsqueeze(0)
    with torch.no_grad():
        a, b = parent(ids).logits, child(ids).logits
    assert not torch.equal(a, b)  # it did quantize
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.9


def test_the_version_names_its_parent_and_method_is_registered_once_and_gated_against_the_parent(
    quantized: Any, tiny_config: LifecycleConfig, tiny_snapshot: Any
) -> None:
    from flows.gating import gate_baseline
    from flows.quantization import quantize_stage

    home, parent, version = quantized
    assert version.name == tiny_config.registry.model_name
    lineage = version.lineage
    assert (lineage["kind"], lineage["parent"], lineage["method"]) == ("quantized", parent.ref, "rtn-W8A8")
    assert lineage["parent_weights_hash"] == parent.lineage["weights_hash"]
    assert lineage["snapshot"] == tiny_snapshot.hash and lineage["git_sha"]
    again = quantize_stage(tiny_config, home, parent.ref, snapshot=tiny_snapshot.hash, flow_run_id="test")
    assert again.ref == version.ref
    baseline = gate_baseline(tiny_config, home, version)
    assert baseline is not None and baseline.ref == parent.ref


def test_an_already_quantized_folder_and_a_group_that_does_not_divide_are_refused(
    quantized: Any, tiny_base_model: Any, tmp_path: Path
) -> None:
    from training.model.modelio import inspect_model_folder

    with pytest.raises(ModelError, match="already quantized"):
        quantize(inspect_model_folder(_folder(quantized[0])), tmp_path, QuantizeConfig())
    with pytest.raises(ModelError, match="group size 48 does not divide"):  # the tiny layers are 64 and 128 wide
        quantize(tiny_base_model, tmp_path, QuantizeConfig(scheme="W4A16", group_size=48))
    assert not [p for p in tmp_path.iterdir()]  # nothing half-written is left


# slow: an engine start of its own (~60 s in CI); the default run's CLI loop (tests/e2e/test_cli_e2e.py) runs a W8A8
# version on vLLM in bf16 through its gate, and the real model's was served through `lifecycle serve` (docs/results.md)
@pytest.mark.slow
def test_vllm_serves_the_quantized_version_through_our_engine(quantized, tiny_config: LifecycleConfig) -> None:  # type: ignore[no-untyped-def]
    from serving.engines.engine import GenerationRequest, VllmEngine

    home, _, version = quantized
    folder = _folder(home)
    engine = VllmEngine(f"full:{version.lineage['weights_hash']}", folder, tiny_config.serving.engine, lora=False)
    engine.start()
    try:
        assert engine._llm.model_config.dtype == torch.bfloat16
        assert engine._llm.model_config.quantization == "compressed-tensors"
        messages = [{"role": "user", "content": "What is 2 + 3?"}]
        prompt = engine.tokenizer.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True, return_dict=True
        )["input_ids"]

        async def run() -> tuple[str, int]:
            text, tokens = "", 0
            request = GenerationRequest("q-1", list(prompt), max_tokens=12, temperature=0.0)
            async for delta in engine.generate(request):
                text, tokens = text + delta.text, tokens + delta.new_tokens
            return text, tokens

        text, tokens = asyncio.run(run())
        assert tokens > 0 and text
    finally:
        engine.shutdown()
