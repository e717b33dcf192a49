"""The DeepSpeed path on CUDA: SFT under ZeRO 1, 2 and 3, LoRA, DPO, torch.compile, bf16 on NCCL, a run killed
mid-way and resumed, and the export check. Marked ``gpu``: deselected by default, skipped without CUDA.

    make test-gpu                 # or: python -m pytest -m gpu tests/gpu  (add -n 4 with pytest-xdist)

One GPU is enough (one rank each); with several, each run takes two ranks. Results of the runs on a lent H100 are
in docs/results.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from training.config import DistributedConfig, FinetuneConfig
from training.data.snapshot import Snapshot
from training.finetune.launch import DpoSpec, TrainResult, finetune
from training.model.modelio import ModelFolder, inspect_model_folder

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

ZERO = {1: "infra/deepspeed/zero1.json", 2: "infra/deepspeed/zero2.json", 3: "infra/deepspeed/zero3-bf16.json"}


def _config(**changes: Any) -> FinetuneConfig:
    settings: dict[str, Any] = {
        "method": "full",
        "bf16": True,
        "deepspeed_config": ZERO[2],
        "max_steps": 16,
        "learning_rate": 1e-3,
        "warmup_steps": 2,
        "log_every": 2,
        "eval_every": 8,
        "eval_batches": 4,
        "checkpoint_every": 100,
        "micro_batch_size": 8,
        "distributed": DistributedConfig(world_size=min(2, torch.cuda.device_count())),
    }
    return FinetuneConfig(**{**settings, **changes})


def _assert_trained_on_the_gpu(result: TrainResult, stage: int) -> None:
    report = result.report
    assert report.backend == "nccl" and report.device == "cuda"
    assert report.zero_stage == stage and report.deepspeed_config["bf16"]["enabled"] is True
    assert result.equivalence["passed"], result.equivalence
    assert result.metrics["train_tokens"] > 0 and result.metrics["tokens_per_s"] > 0
    if report.objective == "sft":
        assert result.metrics["val_loss"] < result.metrics["val_loss_initial"], result.metrics


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_full_fine_tune_in_bf16_under_each_zero_stage(
    stage: int, chat_snapshot: Snapshot, base_model: ModelFolder, tmp_path: Path
) -> None:
    result = finetune(_config(deepspeed_config=ZERO[stage]), chat_snapshot, base_model, tmp_path / "run")
    _assert_trained_on_the_gpu(result, stage)
    assert (result.export_dir / "model.safetensors").is_file()


def test_lora_fine_tune_exports_a_checked_adapter(
    chat_snapshot: Snapshot, base_model: ModelFolder, tmp_path: Path
) -> None:
    result = finetune(_config(method="lora", learning_rate=3e-3), chat_snapshot, base_model, tmp_path / "run")
    _assert_trained_on_the_gpu(result, 2)
    assert (result.export_dir / "adapter_model.safetensors").is_file()


def test_compiled_fine_tune_trains_and_exports_the_same_keys(
    chat_snapshot: Snapshot, base_model: ModelFolder, tmp_path: Path
) -> None:
    result = finetune(_config(compile=True), chat_snapshot, base_model, tmp_path / "run")
    _assert_trained_on_the_gpu(result, 2)
    assert result.report.compiled is True  # engine.compile() ran; the export check loaded every key back


@pytest.fixture(scope="module")
def sft_model(
    chat_snapshot: Snapshot, base_model: ModelFolder, tmp_path_factory: pytest.TempPathFactory
) -> ModelFolder:
    """The SFT model the preference stage starts from and compares with, as in the lifecycle."""
    result = finetune(_config(), chat_snapshot, base_model, tmp_path_factory.mktemp("sft") / "run")
    return inspect_model_folder(result.export_dir)


def test_dpo_in_bf16_widens_the_preference_margin_and_exports(
    pair_snapshot: Snapshot, sft_model: ModelFolder, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.finetune.dpo import REFERENCE_LOGPS, encode_pairs, pair_logps

    spec = DpoSpec(beta=0.1, sft_weight=1.0, reference=sft_model)
    cfg = _config(max_steps=12, learning_rate=5e-4, eval_every=6, micro_batch_size=4)
    result = finetune(cfg, pair_snapshot, sft_model, tmp_path / "dpo", spec)
    _assert_trained_on_the_gpu(result, 2)
    assert result.report.objective == "dpo"
    assert result.metrics["val_reward_margin_initial"] == pytest.approx(0.0, abs=1e-2)  # starts as its reference
    # the objective itself: the policy's mean log-ratio margin over its training pairs (held-out pairs of 12 tiny
    # steps go either way; tests/integration/test_train_preference.py says why)
    tok = AutoTokenizer.from_pretrained(result.export_dir)
    policy_model = AutoModelForCausalLM.from_pretrained(result.export_dir, dtype=torch.float32).cuda().eval()
    pairs = encode_pairs(pair_snapshot.records("train"), tok, cfg.max_seq_len).pairs
    ref = torch.load(tmp_path / "dpo" / REFERENCE_LOGPS)[: len(pairs)]
    policy = pair_logps(policy_model, pairs, pad_id=tok.pad_token_id, batch_size=8, device=torch.device("cuda"))
    margin = ((policy[:, 0].cpu() - ref[:, 0]) - (policy[:, 1].cpu() - ref[:, 1])).mean().item()
    assert margin > 0, margin


def test_a_killed_run_resumes_from_its_checkpoint_and_lands_where_an_uninterrupted_one_does(
    chat_snapshot: Snapshot, base_model: ModelFolder, tmp_path: Path
) -> None:
    """On CPU ranks the resumed run is bit-identical (tests/integration/test_train.py); on a GPU, kernels that add
    with atomics (embedding and attention backward) make two uninterrupted runs differ in the last bf16 bits, so
    this test holds the resumed run to the curve and the weights of the uninterrupted one within that noise."""
    from support.helpers import killed_after_first_checkpoint

    cfg = _config(max_steps=12, checkpoint_every=4, eval_every=6)
    reference = finetune(cfg, chat_snapshot, base_model, tmp_path / "reference")
    run_dir = tmp_path / "killed"
    call = (
        f"finetune_in_subprocess({cfg.model_dump_json()!r}, {str(chat_snapshot.path.parent)!r}, "
        f"{chat_snapshot.hash!r}, {str(base_model.path)!r}, {str(run_dir)!r})"
    )
    killed_after_first_checkpoint(call, run_dir)
    resumed = finetune(cfg, chat_snapshot, base_model, run_dir)
    assert resumed.report.resumed_from_step == 4 and resumed.steps == reference.steps == 12
    curve = {row["step"]: row["loss"] for row in reference.curve()}
    for row in resumed.curve():
        assert row["loss"] == pytest.approx(curve[row["step"]], abs=0.05), (row, curve)
    a = load_file(reference.export_dir / "model.safetensors")
    b = load_file(resumed.export_dir / "model.safetensors")
    assert a.keys() == b.keys()
    drift = max(float((a[k] - b[k]).abs().max() / a[k].abs().max().clamp(min=1e-6)) for k in a)
    print(json.dumps({"resume_bit_identical": reference.weights_hash == resumed.weights_hash, "max_rel_drift": drift}))
    assert drift < 0.05
