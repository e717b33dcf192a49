"""Hand-built rows for the monitoring tests: ``Row`` implements ``LogRow`` (a request-log row) and ``Pair``
implements ``ShadowRow`` (a shadow comparison); both default to a healthy canary answer."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

T0 = datetime(2025, 1, 1, tzinfo=UTC)
CANARY, CHAMPION = "chat/2", "chat/1"


@dataclass(frozen=True)
class Row:
    """A request-log row implementing ``LogRow``: a healthy canary answer unless told otherwise."""

    at: datetime = T0
    model_version: str | None = CANARY
    assigned_version: str | None = None
    route: str | None = "canary"
    status: str = "ok"
    http_status: int = 200
    ttft_ms: float | None = 100.0
    tpot_ms: float | None = 10.0
    e2e_ms: float | None = 500.0
    pre_filter: str | None = None
    post_filter: str | None = None
    refusal: bool | None = False
    finish_reason: str | None = "stop"
    feedback_rating: int | None = None  # not rated
    completion_tokens: int = 20
    cost_usd: float | None = None  # not costed


@dataclass(frozen=True)
class Pair:
    """A shadow comparison implementing ``ShadowRow``."""

    at: datetime = T0
    primary_version: str = CHAMPION
    shadow_version: str = CANARY
    status: str = "ok"
    length_ratio: float | None = 1.0
    primary_refusal: bool = False
    shadow_refusal: bool = False
    primary_toxicity: float | None = 0.1
    shadow_toxicity: float | None = 0.1
    similarity: float | None = 0.9
    primary_ttft_ms: float | None = 100.0
    shadow_ttft_ms: float | None = 120.0
