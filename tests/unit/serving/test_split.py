"""The traffic split as a pure function: shares within tolerance, stable answers (across processes too: SHA-256, not
``hash``), monotone in the weight, exact at 0 and 100; conversation stickiness; shadow sampling."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from serving.engines import split

KEYS = [f"conv_{i:06d}" for i in range(20_000)]


@pytest.mark.parametrize("weight", [5, 25, 50])
def test_share_of_keys_matches_the_weight(weight: int) -> None:
    share = sum(split.assign(k, weight) == "challenger" for k in KEYS) / len(KEYS)
    # binomial sd at 20k keys is <= 0.36 points; 1 point is ~3 sd
    assert abs(share - weight / 100) < 0.01, share


def test_same_key_same_answer_in_another_process() -> None:
    sample = KEYS[:200]
    here = [split.assign(k, 30) for k in sample]
    assert here == [split.assign(k, 30) for k in sample]
    code = (
        "import json, sys; from serving.engines import split; "
        "print(json.dumps([split.assign(k, 30) for k in json.loads(sys.stdin.read())]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(sample), capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == here  # PYTHONHASHSEED differs per process; SHA-256 does not


def test_raising_the_weight_only_moves_keys_to_the_challenger() -> None:
    weights = [0, 1, 5, 10, 25, 50, 75, 99, 100]
    for low, high in zip(weights, weights[1:], strict=False):
        for k in KEYS[:5000]:
            if split.assign(k, low) == "challenger":
                assert split.assign(k, high) == "challenger", (k, low, high)


def test_edges() -> None:
    assert all(split.assign(k, 0) == "champion" for k in KEYS[:5000])
    assert all(split.assign(k, 100) == "challenger" for k in KEYS[:5000])
    for bad in (-1, 101):
        with pytest.raises(ValueError, match="percentage"):
            split.assign("k", bad)


def test_bucket_is_sha256_of_salt_and_key() -> None:
    digest = hashlib.sha256(b"shadow:abc").digest()
    assert split.bucket("abc", "shadow:") == int.from_bytes(digest[:8], "big") % 10_000
    assert 0 <= split.bucket("") < split.BUCKETS


@pytest.mark.parametrize(
    ("last", "weight", "expected"),
    [
        ("chat/5", 1, "challenger"),  # written by the canary: stays there even at 1 %
        ("chat/4", 100, "champion"),  # written by the champion: stays even at 100 %
        ("chat/5", 0, "champion"),  # weight 0: the canary answers nobody
        (None, 100, "challenger"),
        (None, 0, "champion"),
    ],
)
def test_variant_keeps_a_conversation_on_the_version_that_wrote_its_last_reply(
    last: str | None, weight: int, expected: str
) -> None:
    assert split.variant("conv_x", weight, last_version=last, champion="chat/4", challenger="chat/5") == expected


def test_variant_of_a_conversation_written_by_a_retired_version_is_hashed() -> None:
    for k in KEYS[:500]:
        got = split.variant(k, 30, last_version="chat/3", champion="chat/4", challenger="chat/5")
        assert got == split.assign(k, 30)
    assert split.variant("k", 50, last_version="chat/5", champion="chat/4", challenger=None) == "champion"


@pytest.mark.parametrize("fraction", [0.1, 0.25, 0.5])
def test_shadow_sampling_share_and_independence_from_the_split(fraction: float) -> None:
    sampled = [k for k in KEYS if split.sampled(k, fraction)]
    assert abs(len(sampled) / len(KEYS) - fraction) < 0.01
    # salted: among sampled keys the canary share is still the weight, not 0 or 100 %
    canary = sum(split.assign(k, 25) == "challenger" for k in sampled) / len(sampled)
    assert abs(canary - 0.25) < 0.03
    assert not any(split.sampled(k, 0.0) for k in KEYS[:1000])
    assert all(split.sampled(k, 1.0) for k in KEYS[:1000])
