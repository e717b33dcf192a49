"""The end of a run on rank 0: the full state gathered, the Hugging Face folder (full weights or the adapter)
written, loaded back fresh as a user would, and its logits compared with the trained model's (the export check)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from training.config import FinetuneConfig
from training.finetune.collectives import Collectives
from training.finetune.job import Equivalence, RankJob
from training.finetune.policy import build_model
from training.model.modelio import tensors_hash


def consolidated_state(
    engine: Any, stage: int, run_dir: Path, rank: int, comm: Collectives
) -> dict[str, torch.Tensor] | None:
    """The full state dict on rank 0 (every rank must call this: ZeRO-3 gathers the shards)."""
    if stage == 3:
        tmp = run_dir / "gathered"
        engine.save_16bit_model(str(tmp), "state.pt")
        comm.barrier()
        return torch.load(tmp / "state.pt", map_location="cpu") if rank == 0 else None
    return {k: v.detach().cpu() for k, v in engine.module.state_dict().items()} if rank == 0 else None


def export(cfg: FinetuneConfig, job: RankJob, state: dict[str, torch.Tensor], out: Path) -> torch.nn.Module:
    """Write the Hugging Face folder from ``state``; returns the model that holds exactly those weights.

    LoRA: the adapter is the artifact, applied by its user to the base model as it is on disk. Only the trained
    weights are taken from ``state``: the frozen base weights in it are the engine's copies, rounded to bf16 in a
    bf16 run (on the first GPU run the export check failed on that rounding alone, 0.03 in logits), and no user
    ever loads them."""
    from transformers import AutoTokenizer, GenerationConfig

    base = job.base_model
    model = build_model(cfg, base)
    if cfg.method == "lora":
        trained = {name for name, p in model.named_parameters() if p.requires_grad}
        assert trained <= state.keys(), f"trained weights missing from the state: {sorted(trained - state.keys())[:5]}"
        state = {k: v for k, v in state.items() if k in trained}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, f"unexpected keys in consolidated state: {unexpected[:5]}"
    frozen = {name for name, p in model.named_parameters() if not p.requires_grad} if cfg.method == "lora" else set()
    assert all("lm_head" in k or k in frozen for k in missing), f"missing keys in consolidated state: {missing[:5]}"
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    if cfg.method == "lora":
        config = json.loads((out / "adapter_config.json").read_text())
        config["base_model_name_or_path"] = base
        (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    else:
        GenerationConfig.from_pretrained(base).save_pretrained(out)
    return model


def equivalence(
    cfg: FinetuneConfig, job: RankJob, trained: torch.nn.Module, out: Path, batch: dict[str, torch.Tensor]
) -> Equivalence:
    """Load the export fresh, as a user would, and compare its logits with the training model's."""
    from transformers import AutoModelForCausalLM

    if cfg.method == "lora":
        from peft import PeftModel

        fresh: torch.nn.Module = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(job.base_model), str(out)
        )
    else:
        fresh = AutoModelForCausalLM.from_pretrained(str(out))
    fresh.eval()
    trained.eval()
    with torch.no_grad():
        a = trained(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        b = fresh(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    mask = batch["attention_mask"].bool()
    diff = float((a - b).abs()[mask].max())
    return Equivalence(
        max_abs_logit_diff=diff,
        atol=cfg.equivalence_atol,
        passed=diff <= cfg.equivalence_atol,
        batch_shape=list(batch["input_ids"].shape),
    )


def export_hash(cfg: FinetuneConfig, out: Path) -> str:
    name = "adapter_model.safetensors" if cfg.method == "lora" else "model.safetensors"
    return tensors_hash(load_file(out / name))
