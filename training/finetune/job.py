"""The process boundary between the launcher and its ranks, typed: what every rank is asked to do (:class:`RankJob`,
``RUN_DIR/job.json``, written by ``training.finetune.launch``) and what rank 0 answers (:class:`TrainReport`,
``RUN_DIR/train_result.json``, written by ``training.finetune.worker``, read back into ``TrainResult``).

Both files stay plain JSON with the keys they always had, so a run folder written before these models resumes and
reads back as it did; fields added since have defaults that say what those older runs were (CPU ranks, eager).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from core.config import StrictModel
from training.config import FinetuneConfig, PreferenceLoss

JOB = "job.json"
RESULT = "train_result.json"


class DpoObjective(StrictModel):
    """The preference stage's objective (``training.finetune.dpo``) against a frozen reference model."""

    kind: Literal["dpo"] = Field("dpo", description="The objective: DPO on preference pairs.")
    loss: PreferenceLoss = Field("sigmoid", description="sigmoid DPO or IPO.")
    beta: float = Field(description="DPO's beta.")
    sft_weight: float = Field(description="Weight of the NLL term on the chosen replies.")
    reference_model: str = Field(description="Folder of the frozen reference model.")


class RankJob(StrictModel):
    """Everything a rank needs, from the launcher: the same file for every rank and every node."""

    config: FinetuneConfig = Field(description="The resolved fine-tune config.")
    snapshot_path: str = Field(description="The snapshot folder (chat, or pairs for DPO).")
    snapshot_hash: str = Field(description="Its content hash.")
    base_model: str = Field(description="The model folder training starts from.")
    run_dir: str = Field(description="The run folder: checkpoints, logs, export, report.")
    deepspeed: dict[str, Any] = Field(description="The DeepSpeed config with the run's values filled in.")
    threads_per_rank: int = Field(ge=1, description="torch intra-op threads of each rank.")
    objective: DpoObjective | None = Field(None, description="The preference objective; absent: SFT.")

    @property
    def run_path(self) -> Path:
        return Path(self.run_dir)

    def write(self, path: Path) -> None:
        path.write_text(self.model_dump_json(indent=2, exclude_none=True) + "\n", encoding="utf-8")

    @classmethod
    def read(cls, path: Path) -> RankJob:
        return cls.model_validate_json(path.read_text(encoding="utf-8"))


class Equivalence(StrictModel):
    """The export check: the export loaded fresh, as a user loads it, against the training model's logits."""

    max_abs_logit_diff: float = Field(description="Largest logit difference over the check batch's real tokens.")
    atol: float = Field(description="The tolerance (finetune.equivalence_atol).")
    passed: bool = Field(description="max_abs_logit_diff <= atol.")
    batch_shape: list[int] = Field(description="Shape of the check batch's input ids.")


class TrainReport(StrictModel):
    """Rank 0's account of a finished run."""

    method: Literal["lora", "full"] = Field(description="LoRA adapters or the full model.")
    export_dir: str = Field(description="The exported Hugging Face folder (or adapter).")
    weights_hash: str = Field(description="Hash of the exported weights.")
    steps: int = Field(description="Optimizer steps of the whole run.")
    resumed_from_step: int = Field(description="The checkpoint step this start resumed from (0: none).")
    world_size: int = Field(description="Ranks.")
    backend: str = Field(description="The collective backend (gloo, nccl).")
    device: str = Field("cpu", description="The ranks' device type (runs before this field trained on CPU).")
    compiled: bool = Field(False, description="Whether the model was torch.compile'd.")
    zero_stage: int = Field(description="DeepSpeed ZeRO stage.")
    deepspeed_config: dict[str, Any] = Field(description="The DeepSpeed config the ranks ran.")
    objective: Literal["sft", "dpo"] = Field(description="What was optimized.")
    train_examples: int = Field(description="Training items after encoding (and packing).")
    truncated: int = Field(description="Items cut at max_seq_len.")
    skipped: int = Field(description="Items left without a target token.")
    metrics: dict[str, float | int | None] = Field(description="Validation and throughput numbers.")
    equivalence: Equivalence = Field(description="The export check.")
    seconds: float = Field(description="Rank 0's wall time, start to report.")

    def write(self, path: Path) -> None:
        path.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")

    @classmethod
    def read(cls, path: Path) -> TrainReport:
        return cls.model_validate_json(path.read_text(encoding="utf-8"))
