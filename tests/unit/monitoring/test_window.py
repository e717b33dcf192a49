"""Per-version window statistics from hand-built request-log and shadow rows: what counts for which version, and
as what (rerouted = error, shed by brownout = neither, rejected and 4xx = left out, aborted = out of the success
denominator)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from unit.monitoring.rows import CANARY, CHAMPION, T0, Pair, Row

from monitoring.window import LogRow, ShadowRow, VersionStats, shadow_stats, version_stats


def _protocols(row: Row, pair: Pair) -> tuple[LogRow, ShadowRow]:
    return row, pair  # mypy checks that the test rows satisfy the Protocols


REROUTED = Row(model_version=CHAMPION, assigned_version=CANARY, route="canary-unavailable", ttft_ms=40.0)


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        pytest.param([Row(), Row()], {"n": 2, "answered": 2, "completed": 2, "errors": 0}, id="healthy"),
        pytest.param(
            [
                Row(feedback_rating=1),
                Row(feedback_rating=-1),
                Row(feedback_rating=-1, status="content_filter", post_filter="toxicity"),
                Row(),
                Row(feedback_rating=-1, model_version=CHAMPION, assigned_version=CANARY, route="fallback"),
            ],
            {"n": 5, "rated": 3, "thumbs_down": 2, "thumbs_down_rate": pytest.approx(2 / 3)},
            id="feedback-counts-on-the-answers-the-version-wrote",
        ),
        pytest.param(
            [Row(), REROUTED, REROUTED],
            {"n": 3, "errors": 2, "rerouted": 2, "answered": 1, "success_rate": pytest.approx(1 / 3)},
            id="rerouted-to-the-champion-is-an-error-of-the-canary",
        ),
        pytest.param(
            [Row(), Row(model_version=CHAMPION, assigned_version=CANARY, route="brownout-fallback")],
            {"n": 2, "errors": 0, "shed": 1, "attempts": 1, "success_rate": 1.0},
            id="brownout-shedding-is-neither-success-nor-error",
        ),
        pytest.param(
            [
                Row(),
                Row(route="rejected", model_version=None, assigned_version=CANARY, status="error", http_status=503),
            ],
            {"n": 1, "errors": 0},
            id="rejected-rows-are-left-out",
        ),
        pytest.param(
            [Row(), Row(status="rate_limited", http_status=429), Row(status="error", http_status=400)],
            {"n": 1, "errors": 0},
            id="4xx-rows-are-left-out",
        ),
        pytest.param(
            [Row(), Row(status="aborted"), Row(status="error", ttft_ms=None)],
            {"n": 3, "aborted": 1, "errors": 1, "attempts": 2, "success_rate": 0.5, "abort_rate": pytest.approx(1 / 3)},
            id="aborted-left-out-of-the-success-denominator",
        ),
        pytest.param(
            [
                Row(),
                Row(status="content_filter", pre_filter="jailbreak", ttft_ms=None),
                Row(status="content_filter", post_filter="toxicity"),
                Row(refusal=True),
            ],
            {
                "pre_filter_hits": 1,
                "post_filter_hits": 1,
                "completed": 4,
                "refusals": 1,
                "safety_hit_rate": 0.5,
                "post_filter_rate": 0.25,
                "refusal_rate": 0.25,
            },
            id="safety-hits-and-refusals",
        ),
        pytest.param(
            [Row(model_version=CANARY, assigned_version=None), Row(model_version=CHAMPION, assigned_version=None)],
            {"n": 1, "errors": 0},
            id="old-rows-without-assignment-belong-to-the-answering-version",
        ),
        pytest.param(
            [Row(at=T0 - timedelta(seconds=1), status="error"), Row(at=T0)],
            {"n": 1, "errors": 0},
            id="rows-before-since-are-left-out",
        ),
        pytest.param([], {"n": 0, "success_rate": 1.0, "error_rate": 0.0, "refusal_rate": 0.0}, id="empty"),
    ],
)
def test_version_stats_counts(rows: list[Row], expected: dict[str, object]) -> None:
    stats = version_stats(rows, CANARY, since=T0)
    assert {key: getattr(stats, key) for key in expected} == expected


def test_latencies_come_from_ok_answers_of_the_version_itself() -> None:
    rows = [
        Row(ttft_ms=100.0),
        Row(ttft_ms=200.0),
        Row(status="aborted", ttft_ms=999.0),
        Row(status="content_filter", post_filter="x", ttft_ms=999.0),
        REROUTED,  # the champion's latency, not the canary's
        Row(ttft_ms=None, tpot_ms=None),
    ]
    stats = version_stats(rows, CANARY)
    assert stats.ttft_ms.tolist() == [100.0, 200.0] and stats.tpot_ms.size == 2
    assert stats.percentile("ttft_ms", 50) == 150.0
    assert VersionStats(CANARY, 0).percentile("ttft_ms", 95) is None
    with pytest.raises(ValueError):
        stats.ttft_ms[0] = 1.0  # the window is frozen, its arrays too


def test_shadow_stats_pairs_and_discordant_refusals() -> None:
    pairs = [
        Pair(),
        Pair(shadow_refusal=True),
        Pair(primary_refusal=True, shadow_refusal=True),
        Pair(primary_refusal=True, similarity=0.3, shadow_toxicity=0.5, primary_ttft_ms=None),
        Pair(status="error", similarity=None),
        Pair(shadow_version="chat/9"),
        Pair(at=T0 - timedelta(seconds=5)),
    ]
    s = shadow_stats(pairs, CANARY, since=T0)
    assert (s.n, s.errors, s.ok) == (5, 1, 4)
    assert (s.primary_refusals, s.shadow_refusals) == (2, 2)
    assert (s.shadow_only_refusals, s.primary_only_refusals) == (1, 1)
    assert s.error_rate == 0.2 and s.shadow_refusal_rate == 0.5
    assert s.mean_similarity == pytest.approx((0.9 * 3 + 0.3) / 4)
    assert s.mean_shadow_toxicity == pytest.approx(0.2) and s.mean_primary_toxicity == pytest.approx(0.1)
    assert s.mean_length_ratio == 1.0
    assert s.shadow_ttft_ms.size == s.primary_ttft_ms.size == 3  # paired: both sides measured


def test_protocol_rows_type_check() -> None:
    row, pair = _protocols(Row(), Pair())
    assert version_stats([row], CANARY).n == 1 and shadow_stats([pair], CANARY).n == 1
