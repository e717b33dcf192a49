"""The decision a safety filter returns, shared by the pre-filter (``serving.safety.prefilter``) and the post-filter
(``serving.safety.postfilter``); the gateway logs its ``rule`` and answers with the refusal or stop text when
``blocked``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class FilterVerdict:
    """One filter decision. ``rule`` is machine-readable (metrics, logs); ``reason`` is one line for people."""

    blocked: bool
    stage: Literal["pre", "post"]
    rule: str | None
    reason: str
    score: float | None = None
    classifier: str | None = None  # the safety-classifier version that judged the prompt (serving.safety.harm_filter)
    # what of that version decided: its screen alone (the model did not run: core.harm.Screen), the model, or a
    # cascade's second stage (the model scored the prompt in its band: core.harm.SecondStage);
    # None when the classifier did not judge this prompt (the rules decided, or none is loaded)
    judged_by: Literal["screen", "model", "second"] | None = None
    # during a classifier canary (serving.safety.classifier_canary): the other version, which judged the same turns
    # in shadow, and what it would have done (its rule, or "passed")
    shadow_classifier: str | None = None
    shadow_rule: str | None = None
