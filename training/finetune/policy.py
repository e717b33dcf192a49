"""The model a fine-tune trains: the base model in fp32, whole (``method: full``) or wrapped in LoRA adapters (peft),
seeded so every rank builds the same adapter weights."""

from __future__ import annotations

from typing import Any

import torch

from training.config import FinetuneConfig


def build_model(cfg: FinetuneConfig, base: str) -> Any:  # a transformers PreTrainedModel or a peft PeftModel
    from transformers import AutoModelForCausalLM

    torch.manual_seed(cfg.seed)  # the same adapter init on every rank
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if cfg.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if cfg.method == "lora":
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            r=cfg.lora.r,
            lora_alpha=cfg.lora.alpha,
            lora_dropout=cfg.lora.dropout,
            target_modules=list(cfg.lora.target_modules),
            task_type="CAUSAL_LM",
        )
        return get_peft_model(model, lora)
    return model
