"""GPU smoke tests of the DeepSpeed path (bf16, NCCL). Marked ``gpu``: deselected by default, skipped without CUDA.

.venv/bin/python -m pytest -m gpu tests/integration/test_gpu.py
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from training.config import DistributedConfig, FinetuneConfig
from training.finetune import finetune

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("ds", ["zero2.json", "zero3-bf16.json"])
def test_bf16_nccl_fine_tune_step(ds: str, tiny_snapshot, tiny_base_model, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    world = min(2, torch.cuda.device_count())
    cfg = FinetuneConfig(
        method="full",
        bf16=True,
        deepspeed_config=f"infra/deepspeed/{ds}",
        max_steps=4,
        eval_every=2,
        checkpoint_every=100,
        micro_batch_size=4,
        eval_batches=1,
        equivalence_atol=0.05,
        distributed=DistributedConfig(world_size=world),
    )
    result = finetune(cfg, tiny_snapshot, tiny_base_model, tmp_path / ds)
    assert result.report["backend"] == "nccl"
    assert result.report["deepspeed_config"]["bf16"]["enabled"] is True
    assert result.equivalence["passed"]
    assert result.metrics["val_loss"] < result.metrics["val_loss_initial"] + 0.5
