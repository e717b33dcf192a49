"""The traffic split of a canary rollout, as pure functions: which variant a sticky key belongs to, and which
requests are mirrored to the shadow version.

    assign("conv_3f...", 25)                           # -> "challenger" for about a quarter of the keys
    variant("conv_3f...", 25, last_version="chat/5", champion="chat/4", challenger="chat/5")   # stays put
    sampled("chatcmpl-...", 0.25)                      # mirror this request to the shadow?

A key is hashed with SHA-256 (not Python's ``hash``, which is salted per process: two gateway replicas, or one
restarted, must agree) to a bucket in ``[0, 10000)``; the key goes to the challenger when its bucket is below
``weight * 100``. So the split is:

- **stable**: the same key gets the same answer in every process, on every machine, at every call;
- **monotone in the weight**: raising the weight from 5 to 25 % moves the buckets 500..2499 to the challenger and
  no bucket back to the champion; lowering it moves keys back only from the top of the challenger's range. A
  conversation therefore never flips between versions while a rollout advances;
- **exact at the edges**: weight 0 sends nobody to the challenger, 100 everybody.

Shadow sampling hashes the request id with a salt of its own, so the mirrored requests are independent of the
canary assignment even when both fall back to the request id as their key.
"""

from __future__ import annotations

import hashlib
from typing import Literal

BUCKETS = 10_000
SHADOW_SALT = "shadow:"

Variant = Literal["champion", "challenger"]


def bucket(key: str, salt: str = "") -> int:
    """The key's bucket in ``[0, BUCKETS)``: the first 8 bytes of SHA-256(salt + key), modulo BUCKETS."""
    digest = hashlib.sha256((salt + key).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS


def assign(sticky_key: str, weight: int) -> Variant:
    """``challenger`` for keys whose bucket is below ``weight`` percent of the buckets, else ``champion``."""
    if not 0 <= weight <= 100:
        raise ValueError(f"a canary weight is a percentage in [0, 100], got {weight}")
    return "challenger" if bucket(sticky_key) < weight * (BUCKETS // 100) else "champion"


def variant(
    sticky_key: str, weight: int, *, last_version: str | None, champion: str, challenger: str | None
) -> Variant:
    """The variant of one request to the served name (``last_version``, ``champion`` and ``challenger`` are
    version refs like chat/5).

    Weight 0 (or no challenger) answers everybody with the champion. A continued conversation whose last reply
    was written by the champion's or the challenger's version stays on that version, whatever the hash says
    now (raising the weight never moves a conversation mid-way); one written by another version (rolled back,
    or promoted away) is assigned by the hash like a new one.
    """
    if challenger is None or weight <= 0:
        return "champion"
    if last_version is not None:
        if last_version == challenger:
            return "challenger"
        if last_version == champion:
            return "champion"
    return assign(sticky_key, weight)


def sampled(request_id: str, fraction: float) -> bool:
    """Whether a request is mirrored to the shadow: a salted hash of its id, below ``fraction`` of the buckets."""
    return bucket(request_id, SHADOW_SALT) < round(fraction * BUCKETS)
