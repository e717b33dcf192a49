"""What ``lifecycle train`` prints: the SFT numbers on the fine-tune line, and with the preference stage the SFT
parent and the DPO numbers on lines of their own (flows/commands/render.py)."""

from __future__ import annotations

from pathlib import Path

from core.home import Home
from flows.commands.render import train_lines
from flows.summaries import TrainSummary

SFT = {"val_loss_initial": 2.5, "val_loss": 1.25, "tokens_per_s": 1000.0}
DPO = {
    "val_loss_initial": 0.693,
    "val_loss": 0.41,
    "val_reward_accuracy_initial": 0.0,
    "val_reward_accuracy": 0.92,
    "tokens_per_s": 800.0,
}


def summary(**changes: object) -> TrainSummary:
    fields: dict[str, object] = {
        "flow_run_id": "f",
        "snapshot": "a" * 64,
        "snapshot_counts": {"train": 9},
        "base_model": "/base",
        "base_model_version": "chat-base/1",
        "base_model_metrics": {},
        "model": "chat",
        "version": "1",
        "lineage": {"method": "lora"},
        "metrics": SFT,
        "seconds": {"finetune": 3.0},
    }
    return TrainSummary(**{**fields, **changes})  # type: ignore[arg-type]


def test_an_sft_version_prints_its_method_and_losses() -> None:
    text = "\n".join(train_lines(summary(), Home(Path("/h"))))
    assert "fine-tune   lora: val loss 2.500 -> 1.250" in text and "preference" not in text


def test_an_aligned_version_prints_its_sft_parent_and_the_dpo_numbers() -> None:
    aligned = summary(
        version="2",
        lineage={"method": "full", "preference_snapshot": "b" * 64},
        metrics=DPO,
        sft_parent="chat/1",
        sft_metrics=SFT,
        seconds={"finetune": 3.0, "preference": 2.0},
    )
    text = "\n".join(train_lines(aligned, Home(Path("/h"))))
    assert "fine-tune   val loss 2.500 -> 1.250" in text
    assert "SFT parent  chat/1" in text
    assert "preference  dpo on pairs bbbbbbbbbbbb: val loss 0.693 -> 0.410, reward accuracy 0.00 -> 0.92" in text
    assert "registered  chat/2" in text
