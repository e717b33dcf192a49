"""The ``run:`` section: how ``lifecycle run`` rolls a freshly gated version out under simulated traffic.

Production rollouts use the ``rollout:`` policy against real users (minutes per step, hundreds of requests per
version). ``lifecycle run`` has no users, so it starts the gateway, plays simulated users at ``traffic.rate`` and
analyses every ``rollout.interval_s`` seconds under its own, smaller policy: the same controller, the same
decisions, on a demo's time scale.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from core.config import StrictModel
from monitoring.config import RolloutPolicy


class RunTraffic(StrictModel):
    profile: str = Field("normal", description="Traffic mix of the simulated users (normal, drifted, safety).")
    rate: float = Field(8.0, gt=0, description="Requests per second the simulated users send.")
    concurrency: int = Field(4, ge=1, description="Simulated requests in flight at most.")
    max_tokens: int = Field(24, ge=1, description="max_tokens of each simulated request.")


class RunConfig(StrictModel):
    rollout: bool = Field(
        True, description="After a passing gate, roll the version out (shadow -> canary -> champion)."
    )
    traffic: RunTraffic = Field(default_factory=RunTraffic, description="The simulated users.")
    policy: RolloutPolicy = Field(
        default_factory=lambda: RolloutPolicy(
            interval_s=8,
            steps=[50],
            shadow_min_samples=20,
            min_samples=30,
            min_latency_samples=20,
            passes_to_advance=1,
            failure_limit=2,
            watch_s=8,
        ),
        description="The rollout policy of lifecycle run's simulated rollout (production uses rollout:).",
    )
    max_ticks: int = Field(20, ge=1, description="Analyses before the run gives up waiting (the rollout stays as is).")
    enforce_eager: bool | None = Field(
        None,
        description="The engines of the gateway lifecycle run starts for its simulated users: eager (true), "
        "compiled (false), or as serving.engine.enforce_eager says (null). That gateway lives a few minutes: a "
        "compiled start can cost more than its requests gain (docs/results.md, \"The loop's own gateway and "
        'shorter self-replies").',
    )
    drift_check: bool = Field(
        True,
        description="After the rollout, play drift_requests more simulated requests and check them for drift "
        "against the champion's training data (the retrain decision is recorded either way).",
    )
    drift_requests: int = Field(240, ge=1, description="Simulated requests of the drift check's window.")
    retrain: bool = Field(
        True, description="Act on a triggered retrain (curated snapshot -> train -> gate -> rollout) in the run."
    )


class ScheduleConfig(StrictModel):
    """``lifecycle schedule``: the deployments that keep the loop running, and the local servers it starts."""

    rollout_controller_every_s: int = Field(60, ge=5, description="Rollout controller: one analysis per interval.")
    classifier_canary_every_s: int = Field(
        300,
        ge=5,
        description="Safety-classifier canary: one decision per interval (lifecycle safety-classifier canary).",
    )
    monitor_every_s: int = Field(900, ge=60, description="Monitoring (drift report on the request log) interval.")
    champion_eval_cron: str = Field("0 3 * * *", description="Daily re-evaluation of the champion (cron).")
    retrain_check_cron: str = Field("0 2 * * *", description="Nightly retrain check: drift + quality signals (cron).")
    log_retention_cron: str = Field(
        "30 1 * * *",
        description="Daily erasure of log texts older than serving.log_text_retention_days (cron).",
    )
    timezone: str = Field("UTC", description="Time zone of the cron schedules.")
    host: str = Field("127.0.0.1", description="Interface the local Prefect server and MLflow UI bind.")
    prefect_port: int = Field(4200, ge=0, le=65535, description="Local Prefect server port (0: a free one).")
    mlflow_port: int = Field(5000, ge=0, le=65535, description="MLflow UI port of lifecycle ui (0: a free one).")
    startup_timeout_s: float = Field(
        300, gt=0, description="How long to wait for a local server (Prefect's first start migrates its database)."
    )
    work_pool: str | None = Field(
        None,
        description="Prefect work pool to register the deployments to (prefect worker processes run them; needs "
        "PREFECT_API_URL); null: lifecycle schedule serves them from its own process.",
    )
    heartbeat_s: int = Field(
        30, ge=30, description="Work-pool runs: seconds between flow-run heartbeats (Prefect's minimum is 30)."
    )
    crash_after_s: int = Field(
        90,
        ge=31,
        description="Work-pool runs: a run silent this long (no heartbeat, no end) is marked Crashed: its worker died.",
    )
    crash_retries: int = Field(
        1,
        ge=0,
        le=5,
        description="Work-pool runs: how many more attempts a run whose worker died gets (rescheduled for any "
        "worker; an attempt past these fails at its start).",
    )
    lock_lease_s: int = Field(
        60,
        ge=60,  # Prefect's API refuses shorter leases
        description="Lease of the lock a rollout-controller or retrain-check run holds (renewed while it runs; a "
        "dead holder's lock frees itself after this long).",
    )

    @model_validator(mode="after")
    def _crash_after_heartbeats(self) -> ScheduleConfig:
        if self.crash_after_s <= self.heartbeat_s:
            raise ValueError(
                f"schedule.crash_after_s ({self.crash_after_s}) must exceed schedule.heartbeat_s ({self.heartbeat_s}): "
                "a live run would be marked crashed between two heartbeats"
            )
        return self
