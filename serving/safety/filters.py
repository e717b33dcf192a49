"""Safety filters of the gateway: a pre-filter on prompts (rules + classifier) and a post-filter on streamed replies.

The gateway builds one ``SafetyFilters`` at start-up (``build_filters(cfg.serving.safety)``), calls
``filters.pre.check(messages)`` before any inference, and wraps every streamed reply in ``filters.stream()``
(``feed`` each delta, send what it returns, ``finish`` at the end, stop on ``violation``). Non-streamed replies go
through ``check_text``, which gives the same decision as streaming the same text in any chunking.

This module is the public face; the parts live in ``serving.safety.prefilter`` (the rules table and ``PreFilter``),
``serving.safety.postfilter`` (output patterns and ``StreamFilter``) and ``serving.safety.verdict``
(``FilterVerdict``), and are re-exported here; the classifier is ``core.toxicity.CompiledProfanityScorer``
(the toxicity seam every stage shares).
"""

from __future__ import annotations

from core.text import normalize_prompt
from core.toxicity import CompiledProfanityScorer, ToxicityScorer
from serving.config import SafetyConfig
from serving.safety.harm_filter import (
    ClassifiedPreFilter,
    ClassifierRegistry,
    HarmFilter,
    HarmWindowScorer,
    judged_category,
)
from serving.safety.postfilter import (
    TOXICITY_STRIDE_CHARS,
    TOXICITY_WINDOW_CHARS,
    OutputPattern,
    StreamFilter,
    compile_output_patterns,
)
from serving.safety.prefilter import RULES, PreFilter, Rule
from serving.safety.replies import ReplyLedger
from serving.safety.verdict import FilterVerdict

__all__ = [
    "RULES",
    "TOXICITY_STRIDE_CHARS",
    "TOXICITY_WINDOW_CHARS",
    "CompiledProfanityScorer",
    "OutputPattern",
    "PreFilter",
    "Rule",
    "SafetyFilters",
    "StreamFilter",
    "FilterVerdict",
    "build_filters",
    "compile_output_patterns",
    "normalize_prompt",
]


class SafetyFilters:
    """What the gateway holds: the pre-filter, and a factory of per-reply stream filters sharing compiled patterns."""

    def __init__(
        self,
        cfg: SafetyConfig,
        scorer: ToxicityScorer,
        harm: HarmFilter | None = None,
        canary: HarmFilter | None = None,
    ) -> None:
        self.cfg = cfg
        self.scorer = scorer
        self.harm = harm  # the safety classifier (serving.safety.harm_filter), judging prompts after the rules
        self.canary = canary if harm is not None else None  # a classifier version in canary beside it
        self.replies = ReplyLedger(cfg.reply_ledger_size)  # the replies this gateway wrote (remember_reply)
        self.pre: PreFilter | ClassifiedPreFilter = (
            PreFilter(cfg, scorer)
            if harm is None
            else ClassifiedPreFilter(PreFilter(cfg, scorer), harm, self.canary, self.replies)
        )
        self._patterns = compile_output_patterns(cfg.blocked_output_patterns)
        # a scorer that can say which words it may flag lets unfinished words go out at once (serving.safety.postfilter)
        prefixes = getattr(scorer, "flaggable_prefixes", None)
        self._word_prefixes = prefixes(cfg.toxicity_threshold) if callable(prefixes) else None
        self._post_scorer: ToxicityScorer = scorer
        if harm is not None and cfg.post_classifier:  # sentence windows judged by the classifier too
            self._post_scorer = HarmWindowScorer(scorer, harm, cfg.toxicity_threshold)
            self._word_prefixes = None

    def states(self) -> dict[str, str]:
        """What the classifier and its canary hold now (for /readyz): "loaded safety-classifier/6", "no canary"..."""
        named = (("classifier", self.harm), ("classifier_canary", self.canary))
        return {name: harm.state for name, harm in named if harm is not None}

    def refresh(self) -> None:
        """Follow the classifier's alias and the canary's (blocking: loads a version's folder when one moved)."""
        for harm in (self.harm, self.canary):
            if harm is not None:
                harm.refresh()

    def remember_reply(self, text: str) -> str:
        """A reply the gateway answered (or a stored conversation's): sent back as an assistant turn, the
        pre-filter knows it as the gateway's own and does not judge it (``safety.judge_replies``). Its digest, which
        the request log keeps for the other replicas and the next start (``serving.safety.replies``)."""
        return self.replies.remember(text)

    def blocked_reply(self, rule: str | None) -> str:
        """The answer to a prompt the pre-filter blocked with ``rule``: the harm category's own
        (``category_refusals``) when the classifier judged it, else ``refusal_text``."""
        category = judged_category(rule)
        return self.cfg.category_refusals.get(category, self.cfg.refusal_text) if category else self.cfg.refusal_text

    def stream(self) -> StreamFilter:
        return StreamFilter(self.cfg, self._post_scorer, patterns=self._patterns, word_prefixes=self._word_prefixes)

    def check_text(self, text: str) -> FilterVerdict:
        return self.stream().check_text(text)


def build_filters(cfg: SafetyConfig, registry: ClassifierRegistry | None = None) -> SafetyFilters:
    """The production filters: alt-profanity-check's model (see ``CompiledProfanityScorer``) behind both stages,
    and the safety classifier ``cfg.classifier`` names, loaded from ``registry`` (``HarmFilter.refresh``), with the
    canary version ``cfg.classifier_canary`` names beside it while that alias exists."""
    harm = HarmFilter(cfg, registry) if cfg.classifier and registry is not None else None
    canary = HarmFilter(cfg, registry, canary=True) if harm is not None and cfg.classifier_canary else None
    return SafetyFilters(cfg, CompiledProfanityScorer(), harm, canary)
