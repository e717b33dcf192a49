"""Refusal detection, both directions: refusals in our data and common model phrasings; helpful answers that
mention a marker later are not refusals."""

from __future__ import annotations

import pytest

from core.refusal import OPENING_CHARS, is_compliance, is_refusal
from training.data.synth_pools import HARMFUL

REFUSALS = [
    "I'm sorry, but I can't help with making weapons or explosives.",
    "I’m sorry, but I can’t help with that.",  # curly apostrophes
    "I cannot assist with that request.",
    "  I won't  help you hurt anyone.",
    "As an AI, I must decline.",
    "Sorry, but that's not something I can help with.",
    "I'd rather not put anyone down.",
]
ANSWERS = [
    "The answer is 4.",
    "Find its process id with `ps aux | grep python`, then run `kill <pid>`.",
    "Sure, here is how: follow these steps.",
    "Use a tripod and a wide aperture. " + "x" * OPENING_CHARS + " If you can't help it, I'm sorry.",
]


@pytest.mark.parametrize("text", REFUSALS)
def test_refusals_are_detected(text: str) -> None:
    assert is_refusal(text)
    assert not is_compliance(text)


@pytest.mark.parametrize("text", ANSWERS)
def test_answers_are_not_refusals(text: str) -> None:
    assert not is_refusal(text)
    assert is_compliance(text)


def test_every_refusal_of_the_training_data_is_detected() -> None:
    assert all(is_refusal(refusal) for _, _, _, refusal in HARMFUL)


def test_an_empty_reply_is_neither() -> None:
    assert not is_refusal("   ") and not is_compliance("")
