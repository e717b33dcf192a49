"""Per-version statistics of an analysis window: what the canary analysis compares.

The inputs are Protocols, so this package never imports serving: ``LogRow`` is one request-log row (serving's
``RequestLogEntry`` satisfies it structurally) and ``ShadowRow`` one shadow comparison (a primary answer and the
mirrored answer of the shadow version to the same request).

How a log row counts for a version (``version_stats``):

- it belongs to the version the traffic split *assigned* it to (``assigned_version``, or ``model_version`` on old
  rows without one); ``route == "rejected"`` rows (refused before routing) and 4xx rows (the client's fault) are
  left out;
- answered by another version because the assigned one was unavailable (``fallback``, ``canary-unavailable``):
  an **error** of the assigned version (``rerouted`` counts them too: all of a version's rows rerouted means its
  engine is down);
- answered by another version because the gateway shed load (``brownout-fallback``): **shed**, neither success
  nor error (a load spike is not the version's fault; in LoRA mode champion and canary share one engine);
- otherwise by status: ``error`` -> error, ``aborted`` (the client went away) -> aborted, left out of the success
  denominator; safety hits, refusals, completions and latencies come from the rows the version answered itself;
- user feedback (``feedback_rating``, ``POST /v1/feedback``) counts on the answered rows it rates (``rated``,
  ``thumbs_down``): a rating given after the analysis read the window counts in the next analysis;
- cost (``cost_usd``, the request's share of its engine's busy time, priced) counts on the answered ``ok`` rows
  that carry one, with their completion tokens (``cost_usd`` / ``cost_tokens``: the cost per token).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol

import numpy as np
from numpy.typing import NDArray
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

LatencyName = Literal["ttft_ms", "tpot_ms", "e2e_ms"]


class LogRow(Protocol):
    """One request-log row, as the analysis reads it (read-only)."""

    @property
    def at(self) -> datetime: ...
    @property
    def model_version(self) -> str | None: ...  # the version that answered
    @property
    def assigned_version(self) -> str | None: ...  # the version the traffic split chose; None: = model_version
    @property
    def route(self) -> str | None: ...  # primary, canary, canary-unavailable, fallback, brownout, ..., rejected
    @property
    def status(self) -> str: ...  # ok, content_filter, error, aborted, rate_limited...
    @property
    def http_status(self) -> int: ...
    @property
    def ttft_ms(self) -> float | None: ...
    @property
    def tpot_ms(self) -> float | None: ...
    @property
    def e2e_ms(self) -> float | None: ...
    @property
    def pre_filter(self) -> str | None: ...  # rule that blocked the prompt before inference
    @property
    def post_filter(self) -> str | None: ...  # rule that stopped the reply
    @property
    def refusal(self) -> bool | None: ...  # the reply opens as a refusal
    @property
    def finish_reason(self) -> str | None: ...
    @property
    def feedback_rating(self) -> int | None: ...  # the user's rating of the answer: 1, -1, None (not rated)
    @property
    def completion_tokens(self) -> int: ...
    @property
    def cost_usd(self) -> float | None: ...  # the request's share of its engine's busy time, priced; None: not costed


class ShadowRow(Protocol):
    """One shadow comparison: the primary's answer and the shadow version's answer to the same request."""

    @property
    def at(self) -> datetime: ...
    @property
    def primary_version(self) -> str: ...
    @property
    def shadow_version(self) -> str: ...
    @property
    def status(self) -> str: ...  # ok | error (of the shadow call)
    @property
    def length_ratio(self) -> float | None: ...  # shadow chars / primary chars
    @property
    def primary_refusal(self) -> bool: ...
    @property
    def shadow_refusal(self) -> bool: ...
    @property
    def primary_toxicity(self) -> float | None: ...  # 0..1 classifier scores
    @property
    def shadow_toxicity(self) -> float | None: ...
    @property
    def similarity(self) -> float | None: ...  # cosine of the two answers' embeddings
    @property
    def primary_ttft_ms(self) -> float | None: ...
    @property
    def shadow_ttft_ms(self) -> float | None: ...


def _array(values: list[float]) -> NDArray[np.float64]:
    out = np.asarray(values, dtype=np.float64)
    out.setflags(write=False)  # the stats are frozen; so are their arrays
    return out


def _ratio(num: int, den: int, empty: float = 0.0) -> float:
    return num / den if den else empty


@dataclass(frozen=True)
class VersionStats:
    """Counts and latencies of one version over one window (see the module docstring for what counts how)."""

    version: str
    n: int  # rows assigned to the version
    errors: int = 0  # status error, or rerouted because the version was unavailable
    rerouted: int = 0  # of which answered by another version (fallback, canary-unavailable)
    shed: int = 0  # moved to another version by brownout load shedding: neither success nor error
    aborted: int = 0  # the client went away
    answered: int = 0  # rows the version answered itself (any status)
    pre_filter_hits: int = 0
    post_filter_hits: int = 0
    completed: int = 0  # status ok or content_filter
    refusals: int = 0  # status ok and the reply opens as a refusal
    rated: int = 0  # answers the version wrote that a user rated (thumbs up or down)
    thumbs_down: int = 0  # of which rated down
    ttft_ms: NDArray[np.float64] = field(default_factory=lambda: _array([]), compare=False, repr=False)
    tpot_ms: NDArray[np.float64] = field(default_factory=lambda: _array([]), compare=False, repr=False)
    e2e_ms: NDArray[np.float64] = field(default_factory=lambda: _array([]), compare=False, repr=False)
    # per costed answer (status ok, cost_usd set): its cost and its completion tokens, for the cost per token
    cost_usd: NDArray[np.float64] = field(default_factory=lambda: _array([]), compare=False, repr=False)
    cost_tokens: NDArray[np.float64] = field(default_factory=lambda: _array([]), compare=False, repr=False)

    @property
    def attempts(self) -> int:
        """The success denominator: assigned rows minus aborted and shed ones."""
        return self.n - self.aborted - self.shed

    @property
    def success_rate(self) -> float:
        return 1.0 - self.error_rate

    @property
    def error_rate(self) -> float:
        return _ratio(self.errors, self.attempts)

    @property
    def abort_rate(self) -> float:
        return _ratio(self.aborted, self.answered)

    @property
    def safety_hit_rate(self) -> float:
        return _ratio(self.pre_filter_hits + self.post_filter_hits, self.answered)

    @property
    def pre_filter_rate(self) -> float:
        return _ratio(self.pre_filter_hits, self.answered)

    @property
    def post_filter_rate(self) -> float:
        return _ratio(self.post_filter_hits, self.answered)

    @property
    def refusal_rate(self) -> float:
        return _ratio(self.refusals, self.completed)

    @property
    def thumbs_down_rate(self) -> float:
        return _ratio(self.thumbs_down, self.rated)

    def percentile(self, name: LatencyName, q: float) -> float | None:
        """The ``q``-th percentile (0..100) of a latency in ms; None without measurements."""
        values: NDArray[np.float64] = getattr(self, name)
        return float(np.percentile(values, q)) if values.size else None


def _in_window(at: datetime, since: datetime | None) -> bool:
    return since is None or at >= since


def version_stats(rows: Iterable[LogRow], version: str, since: datetime | None = None) -> VersionStats:
    """The statistics of ``version`` over ``rows`` at or after ``since`` (all rows when None)."""
    names = (
        "n",
        "errors",
        "rerouted",
        "shed",
        "aborted",
        "answered",
        "pre",
        "post",
        "done",
        "refusals",
        "rated",
        "down",
    )
    c = dict.fromkeys(names, 0)
    lat: dict[str, list[float]] = {"ttft_ms": [], "tpot_ms": [], "e2e_ms": [], "cost_usd": [], "cost_tokens": []}
    for row in rows:
        assigned = row.assigned_version or row.model_version
        if assigned != version or row.route == "rejected" or 400 <= row.http_status < 500:
            continue
        if not _in_window(row.at, since):
            continue
        c["n"] += 1
        if row.model_version is not None and row.model_version != version:
            if row.route == "brownout-fallback":
                c["shed"] += 1
            else:
                c["errors"] += 1
                c["rerouted"] += 1
            continue
        if row.status == "error":
            c["errors"] += 1
        elif row.status == "aborted":
            c["aborted"] += 1
        if row.model_version is None:  # failed before any engine answered
            continue
        c["answered"] += 1
        c["pre"] += row.pre_filter is not None
        c["post"] += row.post_filter is not None
        if row.status in ("ok", "content_filter"):
            c["done"] += 1
            if row.feedback_rating is not None:
                c["rated"] += 1
                c["down"] += row.feedback_rating < 0
        if row.status == "ok":
            c["refusals"] += bool(row.refusal)
            for name, value in (("ttft_ms", row.ttft_ms), ("tpot_ms", row.tpot_ms), ("e2e_ms", row.e2e_ms)):
                if value is not None:
                    lat[name].append(value)
            if row.cost_usd is not None:
                lat["cost_usd"].append(row.cost_usd)
                lat["cost_tokens"].append(float(row.completion_tokens))
    return VersionStats(
        version=version,
        n=c["n"],
        errors=c["errors"],
        rerouted=c["rerouted"],
        shed=c["shed"],
        aborted=c["aborted"],
        answered=c["answered"],
        pre_filter_hits=c["pre"],
        post_filter_hits=c["post"],
        completed=c["done"],
        refusals=c["refusals"],
        rated=c["rated"],
        thumbs_down=c["down"],
        ttft_ms=_array(lat["ttft_ms"]),
        tpot_ms=_array(lat["tpot_ms"]),
        e2e_ms=_array(lat["e2e_ms"]),
        cost_usd=_array(lat["cost_usd"]),
        cost_tokens=_array(lat["cost_tokens"]),
    )


@dataclass(frozen=True)
class ShadowStats:
    """The shadow comparisons of one shadow version over one window. Paired quantities (toxicity delta, TTFT)
    come from the ok pairs where both sides were measured."""

    version: str
    n: int  # pairs
    errors: int = 0  # the shadow call failed
    ok: int = 0  # pairs with both answers
    primary_refusals: int = 0
    shadow_refusals: int = 0
    shadow_only_refusals: int = 0  # discordant pairs: the shadow refused, the primary answered
    primary_only_refusals: int = 0  # the primary refused, the shadow answered
    similarity: NDArray[np.float64] = field(default_factory=lambda: _array([]), compare=False, repr=False)
    primary_toxicity: NDArray[np.float64] = field(default_factory=lambda: _array([]), compare=False, repr=False)
    shadow_toxicity: NDArray[np.float64] = field(default_factory=lambda: _array([]), compare=False, repr=False)
    length_ratio: NDArray[np.float64] = field(default_factory=lambda: _array([]), compare=False, repr=False)
    primary_ttft_ms: NDArray[np.float64] = field(default_factory=lambda: _array([]), compare=False, repr=False)
    shadow_ttft_ms: NDArray[np.float64] = field(default_factory=lambda: _array([]), compare=False, repr=False)

    @property
    def error_rate(self) -> float:
        return _ratio(self.errors, self.n)

    @property
    def mean_similarity(self) -> float | None:
        return float(self.similarity.mean()) if self.similarity.size else None

    @property
    def primary_refusal_rate(self) -> float:
        return _ratio(self.primary_refusals, self.ok)

    @property
    def shadow_refusal_rate(self) -> float:
        return _ratio(self.shadow_refusals, self.ok)

    @property
    def mean_primary_toxicity(self) -> float | None:
        return float(self.primary_toxicity.mean()) if self.primary_toxicity.size else None

    @property
    def mean_shadow_toxicity(self) -> float | None:
        return float(self.shadow_toxicity.mean()) if self.shadow_toxicity.size else None

    @property
    def mean_length_ratio(self) -> float | None:
        return float(self.length_ratio.mean()) if self.length_ratio.size else None


def shadow_stats(rows: Iterable[ShadowRow], version: str, since: datetime | None = None) -> ShadowStats:
    """The statistics of shadow ``version`` over ``rows`` at or after ``since`` (all rows when None)."""
    n = errors = ok = p_ref = s_ref = s_only = p_only = 0
    arr: dict[str, list[float]] = {k: [] for k in ("sim", "ptox", "stox", "len", "pttft", "sttft")}
    for row in rows:
        if row.shadow_version != version or not _in_window(row.at, since):
            continue
        n += 1
        if row.status != "ok":
            errors += 1
            continue
        ok += 1
        p_ref += row.primary_refusal
        s_ref += row.shadow_refusal
        s_only += row.shadow_refusal and not row.primary_refusal
        p_only += row.primary_refusal and not row.shadow_refusal
        if row.similarity is not None:
            arr["sim"].append(row.similarity)
        if row.length_ratio is not None:
            arr["len"].append(row.length_ratio)
        if row.primary_toxicity is not None and row.shadow_toxicity is not None:
            arr["ptox"].append(row.primary_toxicity)
            arr["stox"].append(row.shadow_toxicity)
        if row.primary_ttft_ms is not None and row.shadow_ttft_ms is not None:
            arr["pttft"].append(row.primary_ttft_ms)
            arr["sttft"].append(row.shadow_ttft_ms)
    return ShadowStats(
        version=version,
        n=n,
        errors=errors,
        ok=ok,
        primary_refusals=p_ref,
        shadow_refusals=s_ref,
        shadow_only_refusals=s_only,
        primary_only_refusals=p_only,
        similarity=_array(arr["sim"]),
        primary_toxicity=_array(arr["ptox"]),
        shadow_toxicity=_array(arr["stox"]),
        length_ratio=_array(arr["len"]),
        primary_ttft_ms=_array(arr["pttft"]),
        shadow_ttft_ms=_array(arr["sttft"]),
    )


# --- the drift check's view of a window (``monitoring.drift``) ----------------------------------------------


class _Record(BaseModel):
    """Immutable, strict about keys, JSON round-trippable (like ``monitoring.drift``'s result records)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class WindowRates(_Record):
    """Safety-filter hits and refusals of a set of requests (counted like ``monitoring.window.version_stats``,
    over every version): hits per answered request, refusals per completed one."""

    answered: int = Field(ge=0)
    safety_hits: int = Field(ge=0)
    completed: int = Field(ge=0)
    refusals: int = Field(ge=0)

    @property
    def safety_hit_rate(self) -> float | None:
        return self.safety_hits / self.answered if self.answered else None

    @property
    def refusal_rate(self) -> float | None:
        return self.refusals / self.completed if self.completed else None


class WindowSpan(_Record):
    """Which traffic the current side is: its time span and the answered requests per model version (the loop
    guard of ``monitoring.retrain`` reads both)."""

    start: AwareDatetime
    end: AwareDatetime
    versions: dict[str, int] = Field(default_factory=dict)


def window_rates(rows: Iterable[LogRow]) -> WindowRates:
    """Safety hits and refusals over ``rows`` (every version): requests refused before routing and 4xx rows are
    left out, hits count among the rows a model answered, refusals among completed (ok) answers."""
    answered = hits = completed = refusals = 0
    for row in rows:
        if not _answered(row):
            continue
        answered += 1
        hits += row.pre_filter is not None or row.post_filter is not None
        if row.status in ("ok", "content_filter"):
            completed += 1
        if row.status == "ok":
            refusals += bool(row.refusal)
    return WindowRates(answered=answered, safety_hits=hits, completed=completed, refusals=refusals)


class PromptRow(LogRow, Protocol):
    """A request-log row with its prompt (serving's ``RequestLogEntry`` satisfies it)."""

    @property
    def prompt_text(self) -> str | None: ...  # the request's last user message, redacted
    @property
    def conversation_id(self) -> str | None: ...


def window_prompts(rows: Iterable[PromptRow]) -> list[str]:
    """The window's prompts to compare with the reference: the opening prompt of each conversation (its earliest
    row) and every request outside a conversation, in time order; rows refused before routing and empty prompts
    are left out. Follow-up turns ("Thanks. And briefly, why?") are not what the training snapshot's opening
    prompts are made of: 19% of them made normal traffic drift on length and digits in a measurement."""
    seen: set[str] = set()
    out = []
    for row in sorted(rows, key=lambda r: r.at):
        if row.route == "rejected" or not (row.prompt_text or "").strip():
            continue
        if row.conversation_id is not None:
            if row.conversation_id in seen:
                continue
            seen.add(row.conversation_id)
        out.append(row.prompt_text or "")
    return out


def window_span(rows: Iterable[LogRow], start: datetime, end: datetime) -> WindowSpan:
    """The span ``[start, end]`` of the window and the answered requests per model version among ``rows``."""
    versions = Counter(row.model_version for row in rows if row.model_version is not None and _answered(row))
    return WindowSpan(start=start, end=end, versions=dict(sorted(versions.items())))


def _answered(row: LogRow) -> bool:
    """A model answered it (not refused before routing, not the client's 4xx)."""
    return row.route != "rejected" and not 400 <= row.http_status < 500 and row.model_version is not None
