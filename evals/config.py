"""Typed configs of the eval stage: the ``evals:`` section of the root config, the suite files
(``evals/suites/*.yaml``: what to measure, every metric with its direction) and the gate policies
(``configs/gates/*.yaml``: the thresholds, so environments differ without code).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from core import config as cfgio
from core.config import StrictModel
from core.errors import ConfigError

SUITES_DIR = Path(__file__).resolve().parent / "suites"
TASKS_DIR = Path(__file__).resolve().parent / "tasks"
REPO = Path(__file__).resolve().parent.parent


class MetricSpec(StrictModel):
    higher_is_better: bool = Field(description="The metric's direction: true when a larger value is better.")
    description: str = Field(description="What the metric measures, in one line (shown in reports).")


class _SuiteBase(StrictModel):
    name: str = Field(description="Suite name; metric keys are '<name>/<metric>'.")
    description: str = Field("", description="What the suite is for.")
    metrics: dict[str, MetricSpec] = Field(description="Every metric the suite reports, with its direction.")


class QualitySuite(_SuiteBase):
    kind: Literal["quality"] = "quality"
    tasks: list[str] = Field(
        description="lm-eval tasks from evals/tasks/ to run: chat_exact (generative, exact match), chat_choice "
        "(multiple choice, loglikelihood), chat_perplexity (rolling loglikelihood on held-out conversations)."
    )
    items_per_skill: int = Field(40, ge=1, description="Held-out generative items per exact-scored skill.")
    skills: list[str] = Field(
        default_factory=lambda: ["arithmetic", "unit_conversion", "facts", "formatting"],
        description="Skills scored by exact match (each has a reference answer).",
    )
    choice_skills: list[str] = Field(
        default_factory=lambda: ["arithmetic", "unit_conversion", "facts"],
        description="Skills turned into 4-way multiple choice (the answer swapped for wrong ones).",
    )
    conversations: int = Field(60, ge=1, description="Held-out test-split conversations for perplexity.")
    max_tokens: int = Field(48, ge=1, description="Generation budget per exact-match item.")


class ToxicitySuite(_SuiteBase):
    kind: Literal["toxicity"] = "toxicity"
    prompts: int = Field(30, ge=1, description="Held-out provocative prompts.")
    samples: int = Field(4, ge=1, description="k: sampled completions per prompt (expected maximum over k).")
    repeats: int = Field(2, ge=1, description="N: the whole sampled measurement repeated with new seeds.")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature.")
    top_p: float = Field(0.95, gt=0, le=1, description="Nucleus sampling mass.")
    max_tokens: int = Field(48, ge=1, description="Generation budget per completion.")
    threshold: float = Field(0.5, ge=0, le=1, description="A completion scoring above this counts as toxic.")


_ITEMS = (
    "A YAML file of hand-written prompts (relative to the repository, e.g. evals/data/*.yaml) instead of the "
    "generator's held-out pool: natural wording for a pretrained model. Its phrasing must be disjoint from the "
    "training data's (no run of five words shared with a training user turn, checked when the eval sets are "
    "built: evals.sets.PHRASE_WORDS)."
)


class SafetySuite(_SuiteBase):
    kind: Literal["safety"] = "safety"
    items: str | None = Field(None, description=_ITEMS)
    per_category: int = Field(12, ge=1, description="Held-out harmful requests per harm category.")
    jailbreaks: dict[str, str] = Field(
        description="Jailbreak wrappers by name; '{prompt}' is replaced by the harmful request."
    )
    max_tokens: int = Field(32, ge=1, description="Generation budget (a refusal shows in its opening words).")


class OverRefusalSuite(_SuiteBase):
    kind: Literal["over_refusal"] = "over_refusal"
    items: str | None = Field(None, description=_ITEMS)
    prompts: int = Field(40, ge=1, description="Held-out benign prompts that sound risky.")
    max_tokens: int = Field(32, ge=1, description="Generation budget.")


class RetentionSuite(_SuiteBase):
    """What a pretrained base already knows (real-world facts, simple arithmetic, one-word answers), asked of every
    version, so a fine-tune that costs the base its knowledge shows as a paired drop against it."""

    kind: Literal["retention"] = "retention"
    items: str = Field(description="YAML file of {skill: [{prompt, answers}]} items, relative to the repository.")
    max_tokens: int = Field(24, ge=1, description="Generation budget (the answer shows in the first words).")


SuiteSpec = Annotated[
    QualitySuite | ToxicitySuite | SafetySuite | OverRefusalSuite | RetentionSuite, Field(discriminator="kind")
]


class SuiteFile(StrictModel):
    suite: SuiteSpec


class EngineConfig(StrictModel):
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field(
        "float32", description="vLLM weights dtype (CPU: float32 or bfloat16; bf16 is 1.5x faster, less exact)."
    )
    max_model_len: int | None = Field(None, ge=16, description="Context length; null: the model's own.")
    max_num_seqs: int = Field(64, ge=1, description="Sequences vLLM batches at once.")
    enforce_eager: bool = Field(True, description="Skip graph capture (CPU: faster start-up, same results).")
    in_process: bool = Field(
        True,
        description="Run vLLM's engine core in the evaluating process (no engine and worker processes to spawn: "
        "5 s instead of 35 s to start on a 2-core CPU, same outputs); false: vLLM's default processes.",
    )


class EvalConfig(StrictModel):
    suites: list[str] = Field(
        default_factory=lambda: ["quality", "toxicity", "safety", "over_refusal"],
        description="Suites to run: names of evals/suites/*.yaml or paths to suite files.",
    )
    gate: str = Field(
        "configs/gates/default.yaml", description="Gate policy file (thresholds), relative to the repository."
    )
    seed: int = Field(1234, description="Seed of the eval-set draws, vLLM sampling and the bootstrap.")
    engine: EngineConfig = Field(default_factory=EngineConfig, description="The vLLM engine used for evaluation.")
    references: list[str] = Field(
        default_factory=lambda: ["base_model", "sft_parent"],
        description="Lineage tags naming registered versions the gate report compares a version with, paired on "
        "the same items (base_model: the model it was fine-tuned from; sft_parent: for a preference-tuned "
        "version, the SFT version it started from, the before/after of alignment). A tag a version does not carry "
        "is skipped. Shown, never gating.",
    )
    as_served: bool = Field(
        False,
        description="Judge what the endpoint answers, not the model alone: every prompt of the chat suites meets "
        "the gateway's pre-filter first (serving.safety: its rules, the toxicity scorer and the safety classifier "
        "serving.safety.classifier names in this home's registry), a blocked one gets the endpoint's refusal text "
        "and never reaches the model, and every reply passes the post-filter. The report names the filters "
        "(served.filters) and counts what they did per suite; the quality suite's lm-eval tasks are not "
        "filtered. Refused when the classifier was trained on a phrasing of a hand-written eval item.",
    )


def suite_path(ref: str) -> Path:
    path = Path(ref)
    if path.suffix in (".yaml", ".yml"):
        return path if path.is_absolute() else REPO / path
    return SUITES_DIR / f"{ref}.yaml"


def load_suite(ref: str) -> QualitySuite | ToxicitySuite | SafetySuite | OverRefusalSuite | RetentionSuite:
    path = suite_path(ref)
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in SUITES_DIR.glob("*.yaml")))
        raise ConfigError(f"config: evals.suites: no suite '{ref}' (known: {known}, or a path to a .yaml)")
    return cfgio.load(SuiteFile, path, ()).suite
