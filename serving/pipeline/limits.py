"""Per-key rate limits: requests per minute and a token budget per minute, on the ``limits`` library.

The gateway asks, for every request, ``check_request`` (one request against the key's requests-per-minute), then
``reserve_tokens`` for the most the request can cost (prompt tokens + max_tokens) before inference, and
``reconcile`` once the real count is known, giving back what was reserved but not generated. Counters live in
the storage ``api_keys.storage_uri`` names: ``memory://`` for one process, ``redis://host:6379`` when several gateway
replicas must share one budget.

Strategies, and why:

- Requests use the *moving window* (``MovingWindowRateLimiter``): exact over any 60 s span, a refused request
  costs nothing, and its reset time is when the oldest request in the window leaves it, which is the honest
  ``Retry-After``. It stores one entry per request, cheap at requests-per-minute scale.
- Tokens use the *fixed window* (``FixedWindowRateLimiter``) because a reservation must be refundable: its state
  is one counter per key, and every storage that holds one can take a negative increment. The moving window
  (one entry per token, no removal) and the sliding-window counter (weighted across two window keys whose
  names the storage owns) cannot be refunded through the library's API.

Precision of the token budget: the fixed window starts at the first reservation and resets 60 s later, so a key
can spend up to twice its budget across a reset (the usual fixed-window burst). A refund lands in whatever window
is current when ``reconcile`` runs; it is capped at that window's count, so it never drives the counter below
zero, but a request that straddles a reset returns its unused tokens to the new window, over-granting by at most
that unused part. A refused reservation is refunded at once, so asking never costs budget.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from limits import RateLimitItemPerMinute
from limits.errors import ConfigurationError
from limits.storage import Storage, storage_from_string
from limits.strategies import FixedWindowRateLimiter, MovingWindowRateLimiter

from core.errors import ConfigError

WINDOW_S = 60


@dataclass(frozen=True)
class Decision:
    """The answer to one rate-limit question, with what the HTTP layer needs for 429s and ``x-ratelimit-*``.

    ``retry_after_s`` is at least 1 whenever a request is refused and waiting can help; it is 0 when
    ``never`` is true (the request alone exceeds the per-minute limit, so no wait will ever admit it).
    """

    allowed: bool
    limit: int
    remaining: int
    retry_after_s: int = 0
    never: bool = False
    reason: str = ""


class RateLimiter:
    """Requests-per-minute and tokens-per-minute limits per key id, on one ``limits`` storage."""

    def __init__(self, storage_uri: str = "memory://") -> None:
        try:
            storage = storage_from_string(storage_uri)
        except ConfigurationError as exc:
            raise ConfigError(f"api_keys.storage_uri {storage_uri!r}: {exc}") from exc
        if not isinstance(storage, Storage):
            raise ConfigError(f"api_keys.storage_uri {storage_uri!r}: async storages are not supported here")
        try:
            self._requests = MovingWindowRateLimiter(storage)
        except NotImplementedError as exc:
            raise ConfigError(f"api_keys.storage_uri {storage_uri!r}: {exc}; use memory:// or redis://") from exc
        self._tokens = FixedWindowRateLimiter(storage)
        self._storage = storage

    def check_request(self, key_id: str, rpm: int) -> Decision:
        """Count one request against ``rpm`` requests per minute; refused requests are not counted."""
        item = _item(rpm, "lc-requests")
        if self._requests.hit(item, key_id):
            return Decision(True, rpm, self._requests.get_window_stats(item, key_id).remaining)
        stats = self._requests.get_window_stats(item, key_id)
        return Decision(
            False,
            rpm,
            stats.remaining,
            _retry_after(stats.reset_time),
            reason=f"rate limit of {rpm} requests per minute reached",
        )

    def reserve_tokens(self, key_id: str, tpm: int, amount: int) -> Decision:
        """Reserve ``amount`` tokens (prompt + max_tokens) of the ``tpm`` budget before inference."""
        if amount < 0:
            raise ValueError(f"cannot reserve a negative number of tokens ({amount})")
        item = _item(tpm, "lc-tokens")
        if amount > tpm:
            return Decision(
                False,
                tpm,
                self._tokens.get_window_stats(item, key_id).remaining,
                never=True,
                reason=f"this request needs up to {amount} tokens (prompt + max_tokens), more than the limit of "
                f"{tpm} tokens per minute: it can never be admitted; shorten the prompt or lower max_tokens",
            )
        if self._tokens.hit(item, key_id, cost=amount):
            return Decision(True, tpm, self._tokens.get_window_stats(item, key_id).remaining)
        # the fixed window counts a refused hit; give it back so that asking does not spend the budget
        self._give_back(item.key_for(key_id), amount)
        stats = self._tokens.get_window_stats(item, key_id)
        return Decision(
            False,
            tpm,
            stats.remaining,
            _retry_after(stats.reset_time),
            reason=f"token limit of {tpm} per minute reached ({amount} requested, {stats.remaining} left)",
        )

    def reconcile(self, key_id: str, tpm: int, reserved: int, used: int) -> None:
        """Settle a reservation: give back ``reserved - used`` tokens, or charge the excess if ``used`` is more.

        ``tpm`` must be the value the reservation was made with (the counter is keyed by it). An excess is
        charged without refusal (the tokens were already generated) and shows in the next reservation.
        """
        if reserved < 0 or used < 0:
            raise ValueError(f"token counts must be >= 0 (reserved={reserved}, used={used})")
        item = _item(tpm, "lc-tokens")
        key = item.key_for(key_id)
        if used > reserved:
            self._storage.incr(key, item.get_expiry(), amount=used - reserved)
        elif used < reserved:
            self._give_back(key, reserved - used)

    def _give_back(self, key: str, amount: int) -> None:
        """Decrement a fixed-window counter by at most its current value (a reset window owes nothing)."""
        amount = min(amount, self._storage.get(key))
        if amount <= 0:
            return
        value = self._storage.incr(key, WINDOW_S, amount=-amount)
        if value < 0:  # the window reset between get and incr: undo the part that went below zero
            self._storage.incr(key, WINDOW_S, amount=-value)


def _item(limit: int, namespace: str) -> RateLimitItemPerMinute:
    if limit < 1:
        raise ConfigError(f"a per-minute limit must be >= 1, got {limit}")
    return RateLimitItemPerMinute(limit, namespace=namespace)


def _retry_after(reset_time: float) -> int:
    """Whole seconds until strictly after ``reset_time`` (a window still counts a hit exactly at its edge)."""
    return max(1, math.floor(reset_time - time.time()) + 1)
