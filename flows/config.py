"""The root config: every stage's config composed into one object, loaded from ``configs/*.yaml``.

lifecycle --config configs/tiny.yaml --set snapshot.test_fraction=0.2 snapshot
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pydantic import Field, model_validator

from core import config as cfgio
from core.config import StrictModel
from core.home import Home
from evals.config import EvalConfig
from flows.runconfig import RunConfig, ScheduleConfig
from monitoring.config import MonitoringConfig, RolloutPolicy
from registry.config import RegistryConfig
from serving.config import ServingConfig
from training.classifier_config import SafetyClassifierConfig
from training.config import (
    BASE_REPLY_SKILLS,
    BootstrapConfig,
    DataConfig,
    FinetuneConfig,
    PreferenceConfig,
    QuantizeConfig,
    SnapshotConfig,
)

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "default.yaml"


class LifecycleConfig(StrictModel):
    home: str | None = Field(
        None, description="State folder; null means $LIFECYCLE_HOME, else ./.lifecycle (a --home flag wins)."
    )
    data: DataConfig = Field(default_factory=DataConfig, description="Where chat data comes from.")
    snapshot: SnapshotConfig = Field(default_factory=SnapshotConfig, description="Snapshot contracts and splits.")
    base_model: str | None = Field(
        None,
        description="The model to fine-tune: a local Hugging Face folder (for example a Llama 3 checkpoint) or a "
        "registered version (chat-base/1, chat-base@prod); null bootstraps the project's own tokenizer and base "
        "model from the snapshot.",
    )
    bootstrap: BootstrapConfig = Field(default_factory=BootstrapConfig, description="Offline base-model bootstrap.")
    finetune: FinetuneConfig = Field(default_factory=FinetuneConfig, description="DeepSpeed fine-tuning.")
    preference: PreferenceConfig = Field(
        default_factory=PreferenceConfig, description="The preference stage after SFT (DPO on preference pairs)."
    )
    safety_classifier: SafetyClassifierConfig = Field(
        default_factory=SafetyClassifierConfig,
        description="The harm-intent classifier the gateway's pre-filter loads (lifecycle safety-classifier).",
    )
    quantize: QuantizeConfig = Field(
        default_factory=QuantizeConfig, description="Quantized variants of registered versions (lifecycle quantize)."
    )
    registry: RegistryConfig = Field(default_factory=RegistryConfig, description="MLflow tracking and registry.")
    evals: EvalConfig = Field(default_factory=EvalConfig, description="Eval suites and the promotion gate.")
    serving: ServingConfig = Field(
        default_factory=ServingConfig, description="The chat endpoint: engines, routing, keys, limits, safety."
    )
    rollout: RolloutPolicy = Field(
        default_factory=RolloutPolicy,
        description="Progressive delivery: shadow, canary steps, analysis thresholds, rollback and watch.",
    )
    monitoring: MonitoringConfig = Field(
        default_factory=MonitoringConfig, description="Drift of the request log and the retrain trigger."
    )
    run: RunConfig = Field(default_factory=RunConfig, description="What lifecycle run does after the gate.")
    schedule: ScheduleConfig = Field(
        default_factory=ScheduleConfig, description="Deployments and schedules of lifecycle schedule; lifecycle ui."
    )

    @model_validator(mode="after")
    def _base_replies_have_a_base(self) -> LifecycleConfig:
        """The generator's varied benign skills have no answer of their own: only the base's replies train them."""
        gen = self.data.generator
        wanted = [s for s in BASE_REPLY_SKILLS if gen.enabled and gen.counts.get(s, 0) > 0]
        if wanted and not self.finetune.self_replies.enabled:
            raise ValueError(
                f"data.generator.counts.{wanted[0]} needs finetune.self_replies.enabled: its prompts have no "
                "generated answer, only the base model's own reply trains them"
            )
        return self

    def resolve_home(self, flag: str | None = None) -> Home:
        return Home.resolve(flag or self.home)


def load_config(path: Path | None = None, overrides: Iterable[str] = ()) -> LifecycleConfig:
    return cfgio.load(LifecycleConfig, path or DEFAULT_CONFIG, overrides)
