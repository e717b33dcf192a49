from __future__ import annotations

import pytest

from training.model.lr_schedule import FLOOR, warmup_cosine


def test_linear_warmup_then_cosine_to_the_floor() -> None:
    factors = [warmup_cosine(s, warmup=10, total=110) for s in range(120)]
    assert factors[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert factors[10] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(factors[10:], factors[11:], strict=False))  # never rises after warm-up
    assert factors[60] == pytest.approx(FLOOR + (1 - FLOOR) * 0.5)  # half-way through the decay
    assert factors[110:] == pytest.approx([FLOOR] * 10)  # stays at the floor past the end


def test_no_warmup() -> None:
    assert warmup_cosine(0, warmup=0, total=10) == pytest.approx(1.0)
