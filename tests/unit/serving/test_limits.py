"""Per-key rate limits on the ``limits`` library's in-memory storage: requests, token reservations and refunds."""

from __future__ import annotations

import time

import pytest

from core.errors import ConfigError
from serving.pipeline.limits import RateLimiter


@pytest.fixture
def limiter() -> RateLimiter:
    return RateLimiter("memory://")


def test_requests_beyond_rpm_are_refused_with_a_retry_after(limiter: RateLimiter) -> None:
    first, second, third = (limiter.check_request("key_a", 2) for _ in range(3))
    assert first.allowed and first.remaining == 1 and first.limit == 2
    assert second.allowed and second.remaining == 0
    assert not third.allowed and not third.never
    assert 1 <= third.retry_after_s <= 61
    assert "2 requests per minute" in third.reason


def test_refused_requests_do_not_count(limiter: RateLimiter) -> None:
    limiter.check_request("key_a", 1)
    for _ in range(5):
        assert not limiter.check_request("key_a", 1).allowed
    assert limiter.check_request("key_a", 1).remaining == 0  # still one hit in the window, not six


def test_reserved_tokens_come_back_when_reconciled(limiter: RateLimiter) -> None:
    reserved = limiter.reserve_tokens("key_a", 100, 80)
    assert reserved.allowed and reserved.remaining == 20
    refused = limiter.reserve_tokens("key_a", 100, 30)
    assert not refused.allowed and not refused.never and refused.retry_after_s >= 1
    assert refused.remaining == 20  # asking did not spend budget
    limiter.reconcile("key_a", 100, reserved=80, used=50)  # 30 unused tokens go back
    again = limiter.reserve_tokens("key_a", 100, 30)
    assert again.allowed and again.remaining == 20


def test_using_more_than_reserved_is_charged(limiter: RateLimiter) -> None:
    limiter.reserve_tokens("key_a", 100, 10)
    limiter.reconcile("key_a", 100, reserved=10, used=60)
    assert not limiter.reserve_tokens("key_a", 100, 50).allowed
    assert limiter.reserve_tokens("key_a", 100, 40).allowed


def test_a_request_larger_than_the_whole_limit_can_never_succeed(limiter: RateLimiter) -> None:
    d = limiter.reserve_tokens("key_a", 100, 101)
    assert not d.allowed and d.never and d.retry_after_s == 0
    assert "never" in d.reason and "101" in d.reason
    assert limiter.reserve_tokens("key_a", 100, 100).allowed  # and it spent nothing


def test_keys_are_independent(limiter: RateLimiter) -> None:
    assert limiter.check_request("key_a", 1).allowed
    assert not limiter.check_request("key_a", 1).allowed
    assert limiter.check_request("key_b", 1).allowed
    assert limiter.reserve_tokens("key_a", 50, 50).allowed
    assert not limiter.reserve_tokens("key_a", 50, 1).allowed
    assert limiter.reserve_tokens("key_b", 50, 50).allowed


def test_a_refund_after_the_window_reset_does_not_inflate_the_budget(
    limiter: RateLimiter, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [time.time()]
    monkeypatch.setattr(time, "time", lambda: now[0])
    assert limiter.reserve_tokens("key_a", 100, 90).allowed
    now[0] += 61  # the window resets while the request runs
    limiter.reconcile("key_a", 100, reserved=90, used=0)
    assert limiter.reserve_tokens("key_a", 100, 100).allowed
    assert not limiter.reserve_tokens("key_a", 100, 1).allowed


def test_the_window_frees_requests_after_a_minute(limiter: RateLimiter, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [time.time()]
    monkeypatch.setattr(time, "time", lambda: now[0])
    assert limiter.check_request("key_a", 1).allowed
    refused = limiter.check_request("key_a", 1)
    now[0] += refused.retry_after_s
    assert limiter.check_request("key_a", 1).allowed


@pytest.mark.parametrize("uri", ["nosuch://x", "memcached://localhost:11211"])
def test_unusable_storage_is_a_config_error(uri: str) -> None:
    with pytest.raises(ConfigError, match="storage_uri"):
        RateLimiter(uri)


def test_a_zero_limit_is_a_config_error(limiter: RateLimiter) -> None:
    with pytest.raises(ConfigError, match=">= 1"):
        limiter.check_request("key_a", 0)
