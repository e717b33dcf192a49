"""The rollout policy (the ``rollout:`` section of the root config) and the ``monitoring:`` section.

A new version goes shadow (mirrored traffic, never answers users) -> canary steps (``steps``, percent of live
traffic) -> champion (100%), then is watched for ``watch_s`` against the previous champion before the rollout is
finished. Every analysis interval the controller compares the candidate's request-log window with the baseline's
(``monitoring.canary``) and feeds the verdict to the state machine (``monitoring.rollout.decide``). Every number
the analysis and the state machine use lives here, so environments differ by YAML, not code.
"""

from __future__ import annotations

from itertools import pairwise

from pydantic import Field, field_validator

from core.config import StrictModel
from monitoring.drift_config import DriftConfig, RetrainPolicy


class RolloutThresholds(StrictModel):
    """What counts as a regression. Rate tolerances are absolute differences (candidate - baseline) in
    proportion units; latency deltas are in milliseconds."""

    min_success_rate: float = Field(
        0.99,
        ge=0,
        le=1,
        description="Absolute floor on the candidate's success rate (a guardrail: a version confidently below it "
        "is rolled back at once, even before min_samples).",
    )
    error_rate_tolerance: float = Field(
        0.01, ge=0, le=1, description="Allowed increase of the error rate over the baseline's."
    )
    ttft_p95_delta_ms: float = Field(50, ge=0, description="Allowed increase of the p95 time to first token (ms).")
    ttft_p99_delta_ms: float = Field(100, ge=0, description="Allowed increase of the p99 time to first token (ms).")
    tpot_p95_delta_ms: float = Field(20, ge=0, description="Allowed increase of the p95 time per output token (ms).")
    safety_hit_tolerance: float = Field(
        0.02,
        ge=0,
        le=1,
        description="Allowed increase of the safety-filter hit rate (pre + post) and of the post-filter rate alone.",
    )
    refusal_tolerance: float = Field(
        0.05,
        ge=0,
        le=1,
        description="Allowed change of the refusal rate in either direction (refusing far less than the champion "
        "is as suspicious as refusing more: a poisoned model complies).",
    )
    abort_tolerance: float = Field(
        0.05, ge=0, le=1, description="Allowed increase of the client-abort rate (users leaving mid-answer)."
    )
    thumbs_down_tolerance: float = Field(
        0.05,
        ge=0,
        le=1,
        description="Allowed increase of the thumbs-down rate (thumbs down / rated answers, POST /v1/feedback) over "
        "the baseline's.",
    )
    cost_ratio_tolerance: float = Field(
        1.0,
        ge=0,
        description="Allowed increase of the cost per completion token over the baseline's, as a fraction of it "
        "(1.0: up to twice the baseline's). Lenient because cost per token depends on load: canary and champion "
        "adapters sharing a base engine share its busy time evenly, but a full-model canary on an engine of its own "
        "at a small weight is less batched and costs more per token by load alone (docs/operations.md).",
    )
    shadow_min_similarity: float = Field(
        0.5, ge=-1, le=1, description="Floor on the mean embedding similarity of shadow and primary answers."
    )
    shadow_refusal_tolerance: float = Field(
        0.1, ge=0, le=1, description="Allowed change of the shadow's refusal rate vs the primary's, either direction."
    )
    shadow_toxicity_tolerance: float = Field(
        0.1, ge=0, le=1, description="Allowed increase of the mean toxicity score (shadow - primary, paired)."
    )
    shadow_ttft_delta_ms: float = Field(
        200, ge=0, description="Allowed increase of the shadow's p95 time to first token over the primary's (ms)."
    )


class RolloutPolicy(StrictModel):
    """How a version moves from shadow to champion, and when it is rolled back."""

    interval_s: float = Field(60, gt=0, description="Seconds between analyses (the rollout controller's schedule).")
    steps: list[int] = Field(
        default_factory=lambda: [5, 25, 50],
        min_length=1,
        description="Canary traffic weights in percent, strictly increasing, each 1..99; the step after the last "
        "is promotion to champion (100%).",
    )
    shadow_min_samples: int = Field(
        30,
        ge=0,
        description="Shadow pairs (primary + mirrored answer) needed before the shadow analysis decides; 0 skips "
        "the shadow phase (the rollout starts at the first canary step).",
    )
    min_samples: int = Field(
        100,
        ge=1,
        description="Requests per version (canary and baseline both) in an analysis window before it can pass.",
    )
    min_feedback: int = Field(
        30,
        ge=1,
        description="Rated answers per version (canary and baseline both) before the thumbs-down comparison can "
        "fail; below it the check passes with 'too little feedback' (users rate few answers: it must not hold a "
        "rollout).",
    )
    min_latency_samples: int = Field(
        30, ge=1, description="Latency measurements per version needed before a latency check decides."
    )
    passes_to_advance: int = Field(
        2, ge=1, description="Consecutive passing analyses needed to advance a step (hysteresis)."
    )
    failure_limit: int = Field(
        2,
        ge=1,
        description="Failing analyses within one rollout (cumulative, never reset) that abort it with a rollback.",
    )
    alpha: float = Field(
        0.05, gt=0, lt=0.5, description="Significance level of every test (one-sided intervals are 1 - alpha)."
    )
    bootstrap_resamples: int = Field(1000, ge=100, description="Bootstrap resamples of the latency comparisons.")
    seed: int = Field(0, description="Seed of the bootstrap (the same windows give the same verdict).")
    watch_s: float = Field(
        600,
        ge=0,
        description="After promotion, seconds the new champion is watched against the previous champion's "
        "baseline (a failure rolls back) before the rollout is finished.",
    )
    thresholds: RolloutThresholds = Field(
        default_factory=RolloutThresholds, description="The regression thresholds of the analysis."
    )

    @field_validator("steps")
    @classmethod
    def _steps_increasing(cls, steps: list[int]) -> list[int]:
        if any(not 1 <= w <= 99 for w in steps):
            raise ValueError(f"every canary step is a weight in percent between 1 and 99, got {steps}")
        if any(b <= a for a, b in pairwise(steps)):
            raise ValueError(f"canary steps must be strictly increasing, got {steps}")
        return steps


class WatchConfig(StrictModel):
    """The champion watch (``lifecycle watch``): Alertmanager's webhook receiver. Every alert is recorded on the
    champion; a severe one (``rollback_severities``) of a signal in ``rollback_signals`` about the champion, within
    ``rollback_window_s`` of its promotion, rolls back to previous-champion."""

    host: str = Field("127.0.0.1", description="Interface the webhook receiver binds.")
    port: int = Field(9095, ge=0, le=65535, description="Port of the webhook receiver (0: any free port).")
    rollback_window_s: float = Field(
        3600, ge=0, description="How long after a promotion a severe breach rolls the champion back (seconds)."
    )
    rollback_severities: list[str] = Field(
        default_factory=lambda: ["critical"], description="Alert severities (label severity) that roll back."
    )
    rollback_signals: list[str] = Field(
        default_factory=lambda: ["slo", "safety"],
        description="Alert signals (label signal) that roll back; others (availability, quality) go to a person.",
    )
    eval_drop: float = Field(
        0.05,
        gt=0,
        le=1,
        description="The daily champion eval raises ChampionEvalDrop when a metric worsens by more than this "
        "fraction of its previous daily value.",
    )
    alertmanager_url: str | None = Field(
        None,
        description="Alertmanager's base URL (http://127.0.0.1:9093): the daily champion eval posts its drop "
        "alert there; null: no alert is posted (the eval's tags still say regressed).",
    )


class ClassifierCanaryPolicy(StrictModel):
    """When a safety-classifier version in canary is promoted or rolled back (``lifecycle safety-classifier canary``,
    ``monitoring.classifier_canary``). Rates are over the prompts both versions judged (paired)."""

    min_requests: int = Field(300, ge=1, description="Paired prompts before the canary may be promoted.")
    max_requests: int = Field(
        5000,
        ge=1,
        description="Paired prompts after which a canary not yet shown within the limits is rolled back.",
    )
    max_extra_block_rate: float = Field(
        0.01,
        ge=0,
        le=1,
        description="Share of prompts the canary blocks and the champion passes (its new false-block risk).",
    )
    max_missed_block_rate: float = Field(
        0.01,
        ge=0,
        le=1,
        description="Share of prompts the champion blocks and the canary passes (what it stops catching).",
    )
    max_disputed_increase: float = Field(
        0.10,
        ge=0,
        le=1,
        description="How much higher the share of the canary's blocks rated thumbs-down may be than the champion's.",
    )
    z: float = Field(
        4.0,
        gt=0,
        description="Standard errors a rate must be past its limit for a rollback before max_requests (the gate's "
        "4-standard-error rule).",
    )


class MonitoringConfig(StrictModel):
    """The ``monitoring:`` section: prompt drift of the request log and the retrain trigger it feeds."""

    drift: DriftConfig = Field(default_factory=DriftConfig, description="The drift report (lifecycle monitor).")
    retrain: RetrainPolicy = Field(
        default_factory=RetrainPolicy, description="When drift and quality signals trigger a retrain."
    )
    embeddings: bool = Field(
        True, description="Embed prompts with the bundled MiniLM for the embedding view (false: descriptors only)."
    )
    watch: WatchConfig = Field(
        default_factory=WatchConfig, description="The champion watch: what Prometheus' alerts do (lifecycle watch)."
    )
    classifier_canary: ClassifierCanaryPolicy = Field(
        default_factory=ClassifierCanaryPolicy,
        description="When a safety-classifier version in canary is promoted or rolled back.",
    )
