"""The learning-rate schedule pretraining and fine-tuning share: linear warm-up, then cosine decay to 10%."""

from __future__ import annotations

import math

FLOOR = 0.1  # the decay ends at 10% of the peak rate, not at zero


def warmup_cosine(step: int, warmup: int, total: int) -> float:
    """Multiplier of the peak learning rate at optimizer step ``step`` (0-based)."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return FLOOR + (1 - FLOOR) * 0.5 * (1 + math.cos(math.pi * progress))
