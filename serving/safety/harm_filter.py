"""The safety classifier as a pre-filter stage: the version an alias names (``serving.safety.classifier``,
``safety-classifier@champion`` by default), loaded from the registry, judging each prompt after the rules.

    harm = HarmFilter(cfg.safety, HarmSource(registry, cfg.safety.classifier))
    harm.refresh()                                  # at start-up and with every registry refresh: follow the alias
    pre = ClassifiedPreFilter(PreFilter(cfg.safety, scorer), harm)
    verdict = pre.check(messages)                   # the rules and the toxicity scorer, then the classifier

What it scores: the newest user (or tool) turn, and when the conversation has earlier user turns or system
messages, the newest ``context_turns`` of the turns joined, with the system messages ahead of them (a request split
over several turns, or written into the system prompt, is judged whole; a system message is never judged alone).
Assistant turns the gateway did not write (``safety.judge_replies``, ``serving.safety.replies``: a client can forge
one) are judged the same way, joined and never alone.
A prompt whose harm score reaches the version's threshold is blocked with rule ``classifier.<category>``; every
verdict carries the version that judged it (``FilterVerdict.classifier``), which the gateway puts in the
``x-safety-classifier-version`` header and the request log.

When the alias names no version (or loading fails), ``classifier_missing`` decides: ``rules-only`` serves with
the rules and the toxicity scorer alone, ``fail-closed`` blocks every prompt (rule ``classifier.unavailable``);
either way it is logged once per change and /readyz can show it (``HarmFilter.state``).

A canary (``serving.safety.classifier_canary``, ``safety-classifier@challenger`` by default): while that alias
names another version, a second ``HarmFilter`` holds it and both judge every prompt. For
``classifier_canary_percent`` of conversations (a hash of their first user turn, so a conversation stays with
one version) the canary's verdict is the one served; the other version's verdict rides along as the shadow
(``FilterVerdict.shadow_classifier`` / ``shadow_rule``, kept in the request log), which is what
``lifecycle safety-classifier canary`` compares (``monitoring.classifier_canary``). When the alias goes (promoted
or rolled back) the canary's version is dropped at the next refresh.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Literal, Protocol

from core.harm import HarmClassifier
from core.toxicity import ToxicityScorer
from registry.store import ModelVersion
from serving.config import SafetyConfig
from serving.safety.replies import KnownReplies
from serving.safety.verdict import FilterVerdict

log = logging.getLogger("lifecycle.serving")

RULE_PREFIX = "classifier."  # a classifier verdict's rule: classifier.<category>, or classifier.unavailable
UNAVAILABLE = RULE_PREFIX + "unavailable"  # fail-closed without a loaded version: nothing was judged


def judged_category(rule: str | None) -> str | None:
    """The harm category of a rule the classifier blocked with (``classifier.weapons`` -> ``weapons``); None for
    any other rule, and for a fail-closed block that no classifier judged."""
    if not rule or not rule.startswith(RULE_PREFIX) or rule == UNAVAILABLE:
        return None
    return rule.removeprefix(RULE_PREFIX)


class ClassifierRegistry(Protocol):
    def parse(self, ref: str) -> ModelVersion: ...

    def resolve(self, ref: str) -> Path: ...


class HarmFilter:
    """Holds the classifier the alias names now; ``refresh`` follows the alias (thread-safe swap). ``canary``:
    this one holds ``cfg.classifier_canary``, dropped when its alias goes, never failing closed."""

    def __init__(self, cfg: SafetyConfig, registry: ClassifierRegistry | None, *, canary: bool = False) -> None:
        self.cfg = cfg
        self.registry = registry
        self.canary = canary
        self.ref = cfg.classifier_canary if canary else cfg.classifier
        self.classifier: HarmClassifier | None = None
        self.state = "not loaded"
        self._lock = threading.Lock()

    def refresh(self) -> None:
        ref = self.ref
        if not ref or self.registry is None:
            self.state = "disabled"
            return
        try:
            mv = self.registry.parse(ref)
            if self.classifier is not None and self.classifier.version == mv.ref:
                return
            clf = HarmClassifier.load(self.registry.resolve(mv.ref), version=mv.ref)
        except Exception as exc:  # no such alias yet, a broken artifact: keep serving, as configured
            if self.canary:  # no canary now (the usual state), or it ended: promoted or rolled back
                state = f"no canary ({ref}: {type(exc).__name__})"
                if self.classifier is not None:
                    log.info("safety classifier canary %s ended: %s", self.classifier.version, state)
                with self._lock:
                    self.classifier = None
                self.state = state
                return
            state = f"{ref} unavailable ({type(exc).__name__}: {exc}); {self.cfg.classifier_missing}"
            if state != self.state and self.classifier is None:
                log.warning("safety classifier %s", state)
                self.state = state
            return
        with self._lock:
            self.classifier = clf
        self.state = f"loaded {mv.ref}"
        role = "canary" if self.canary else "classifier"
        log.info("safety %s %s loaded (threshold %.3f)", role, mv.ref, clf.threshold)

    def check(
        self, texts: list[str], instructions: tuple[str, ...] = (), replies: tuple[str, ...] = ()
    ) -> FilterVerdict | None:
        """None when it is off; a verdict naming the version that judged otherwise. ``texts``: the user and tool
        turns; ``instructions``: the system messages, and ``replies``: the assistant turns the gateway did not
        write, judged with them (``HarmClassifier.judge_turns``)."""
        clf = self.classifier
        if clf is None:
            if self.cfg.classifier and self.cfg.classifier_missing == "fail-closed" and not self.canary:
                return FilterVerdict(True, "pre", UNAVAILABLE, f"safety classifier {self.state}")
            return None
        score = clf.judge_turns(texts, self.cfg.context_turns, instructions, replies)
        by: Literal["screen", "model", "second"] = (
            "screen" if score.screened else "second" if score.escalated else "model"
        )
        if clf.blocks(score):
            reason = f"classifier {clf.version} scored {score.score:.3f} >= {clf.threshold:.3f} ({score.category})"
            if score.escalated:
                reason += ", blocked by its second stage"
            if replies:
                reason += f"; judged with {len(replies)} assistant turn(s) the gateway did not write"
            return FilterVerdict(True, "pre", RULE_PREFIX + score.category, reason, score.score, clf.version, by)
        return FilterVerdict(False, "pre", None, "passed", score.score, clf.version, by)


class HarmWindowScorer:
    """The post-filter's scorer with the classifier in it (``safety.post_classifier``): each sentence window gets
    the higher of its toxicity score and its harm score rescaled so that the classifier's own threshold lands on
    ``toxicity_threshold``; the stream filter's windows, release rule and no-leak guarantee are unchanged (any
    word may now tip a window, so each is held until it ends: no ``flaggable_prefixes``)."""

    def __init__(self, toxicity: ToxicityScorer, harm: HarmFilter, toxicity_threshold: float) -> None:
        self.toxicity = toxicity
        self.harm = harm
        self.toxicity_threshold = toxicity_threshold
        self.name = f"{toxicity.name} + safety classifier"

    def score(self, texts: Sequence[str]) -> list[float]:
        tox = self.toxicity.score(texts)
        clf = self.harm.classifier
        if clf is None or not texts:
            return tox
        harm = [s.score for s in clf.scores(list(texts))]
        scale = self.toxicity_threshold / clf.threshold if clf.threshold > 0 else 1.0
        return [max(t, min(1.0, h * scale)) for t, h in zip(tox, harm, strict=True)]


class ClassifiedPreFilter:
    """The pre-filter with the classifier: the named rules and the toxicity scorer first, then the classifier (and,
    during a canary, the canary version beside it: the module docstring)."""

    def __init__(
        self,
        rules: RulesPreFilter,
        harm: HarmFilter,
        canary: HarmFilter | None = None,
        replies: KnownReplies | None = None,
    ) -> None:
        self.rules = rules
        self.harm = harm
        self.canary = canary
        self.replies = replies  # the replies this gateway wrote (serving.safety.replies); None: it vouches for none

    def check(self, messages: list[dict[str, str]]) -> FilterVerdict:
        verdict = self.rules.check(messages)
        version = self.harm.classifier.version if self.harm.classifier is not None else None
        if verdict.blocked or verdict.rule is None and verdict.reason != "passed":  # blocked, disabled or empty
            return _with_version(verdict, version)
        texts = [m.get("content") or "" for m in messages if m.get("role") in ("user", "tool")]
        texts = [t for t in texts if t.strip()]
        instructions = tuple(
            t for m in messages if m.get("role") in ("system", "developer") and (t := m.get("content") or "").strip()
        )
        replies = self._unverified_replies(messages) if texts else ()
        harm = self.harm.check(texts, instructions, replies) if texts else None
        if harm is None or harm.rule == UNAVAILABLE:
            return harm or _with_version(verdict, version)
        decider, shadow = harm, self._canary_check(texts, instructions, replies, harm)
        if shadow is not None and self._canary_decides(texts[0]):
            decider, shadow = shadow, decider
        other = shadow.classifier if shadow is not None else None
        other_rule = (shadow.rule if shadow.blocked else "passed") if shadow is not None else None
        if decider.blocked:
            return replace(decider, shadow_classifier=other, shadow_rule=other_rule)
        return replace(
            verdict,
            classifier=decider.classifier,
            judged_by=decider.judged_by,
            shadow_classifier=other,
            shadow_rule=other_rule,
        )

    def _unverified_replies(self, messages: list[dict[str, str]]) -> tuple[str, ...]:
        """The assistant turns the classifier judges with the user turns (``safety.judge_replies``): those after the
        oldest of the newest ``context_turns`` user and tool turns (the window the joined group reads; all of them
        when the conversation has fewer), the newest ``context_turns`` of them, less the ones this gateway wrote."""
        cfg = self.harm.cfg
        if cfg.judge_replies == "none":
            return ()
        at = [
            i for i, m in enumerate(messages) if m.get("role") in ("user", "tool") and (m.get("content") or "").strip()
        ]
        start = at[-cfg.context_turns] if len(at) > cfg.context_turns else 0
        replies = [
            t for m in messages[start:] if m.get("role") == "assistant" and (t := m.get("content") or "").strip()
        ][-cfg.context_turns :]
        if replies and cfg.judge_replies == "unverified" and self.replies is not None:
            replies = [t for t, known in zip(replies, self.replies.known(replies), strict=True) if not known]
        return tuple(replies)

    def _canary_check(
        self, texts: list[str], instructions: tuple[str, ...], replies: tuple[str, ...], harm: FilterVerdict
    ) -> FilterVerdict | None:
        """The canary version's verdict on the same turns; None without a canary (or when it is the champion)."""
        canary = self.canary.classifier if self.canary is not None else None
        if canary is None or self.canary is None or canary.version == harm.classifier:
            return None
        return self.canary.check(texts, instructions, replies)

    def _canary_decides(self, first_turn: str) -> bool:
        """Whether this conversation is in the canary's share (its first user turn, hashed: stable per conversation)."""
        digest = hashlib.blake2b(first_turn.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        return int.from_bytes(digest, "big") % 100 < self.harm.cfg.classifier_canary_percent


class RulesPreFilter(Protocol):
    def check(self, messages: list[dict[str, str]]) -> FilterVerdict: ...


def _with_version(verdict: FilterVerdict, version: str | None) -> FilterVerdict:
    return replace(verdict, classifier=version) if version else verdict
