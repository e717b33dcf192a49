"""The endpoint's safety filters in front of an eval (``evals.as_served``): the gateway's own ``SafetyFilters``
(``serving.safety``, the classifier its alias names in this home's registry) as ``evals.generation.Screen``.

    screen = endpoint_screen(cfg, home, registry, suites)   # DataError if the classifier learnt an eval phrasing
    report = run_eval(cfg.evals, target, sets, suites, screen=screen)

A blocked prompt gets the gateway's answer (``refusal_text``, or its category's: ``category_refusals``); a reply
the post-filter stops ends with ``stopped_text`` after what it released. The gate then judges what a client would
read. That verdict means something only when the classifier never saw the eval's wording, so the screen is refused
when its training split shares a phrasing (a run of ``PHRASE_WORDS`` words, or a whole prompt) with a hand-written
eval item; the harm snapshot keeps them apart since 2026-11-28 (``training.data.harm_synth``: ``avoid``).
"""

from __future__ import annotations

from collections.abc import Sequence

from core.errors import DataError, NotFoundError
from core.hashing import sha256_json
from core.home import Home
from evals.generation import Messages
from evals.sets import Suite, hand_written_prompts, phrasing_leaks
from flows.config import LifecycleConfig
from serving.safety.filters import SafetyFilters, build_filters
from serving.safety.harm_filter import ClassifierRegistry
from training.data.snapshot import load_snapshot


class EndpointScreen:
    """``evals.generation.Screen`` over the gateway's filters."""

    def __init__(self, filters: SafetyFilters) -> None:
        self.filters = filters
        safety = filters.cfg
        clf = filters.harm.classifier if filters.harm is not None else None
        judged = (
            f"classifier {clf.version} (threshold {clf.threshold:.3f})"
            if clf is not None
            else f"no classifier ({filters.harm.state if filters.harm is not None else 'none configured'})"
        )
        on = {True: "on", False: "off"}
        switches = f"pre-filter {on[safety.pre_filter]}, post-filter {on[safety.post_filter]}"
        self.identity = f"{judged}; {switches}; serving.safety {sha256_json(safety.model_dump(mode='json'))[:12]}"

    def blocked(self, messages: Messages) -> str | None:
        verdict = self.filters.pre.check(messages)
        return self.filters.blocked_reply(verdict.rule) if verdict.blocked else None

    def served(self, reply: str) -> str:
        stream = self.filters.stream()
        out = stream.feed(reply)
        if stream.violation is None:
            out += stream.finish()
        return out if stream.violation is None else f"{out}{self.filters.cfg.stopped_text}"


def endpoint_screen(
    cfg: LifecycleConfig, home: Home, registry: ClassifierRegistry, suites: Sequence[Suite]
) -> EndpointScreen:
    """The filters ``cfg.serving.safety`` builds, with the classifier version its alias names now; refused
    (``DataError``) when that version's training data holds the wording of a hand-written item of ``suites``."""
    filters = build_filters(cfg.serving.safety, registry)
    filters.refresh()
    clf = filters.harm.classifier if filters.harm is not None else None
    if clf is not None:
        mv = registry.parse(clf.version)
        snapshot = mv.lineage.get("snapshot")
        try:
            snap = load_snapshot(home.harm_snapshots, snapshot or "")
        except NotFoundError as exc:
            raise NotFoundError(
                f"evals.as_served: the safety classifier {mv.ref} names the harm snapshot {snapshot!r}, not in this "
                f"home ({home.harm_snapshots}): its training data cannot be checked against the eval items"
            ) from exc
        leaks = phrasing_leaks(hand_written_prompts(suites), (r["text"] for r in snap.records("train")))
        if leaks:
            item, words = leaks[0]
            raise DataError(
                f"evals.as_served: the safety classifier {mv.ref} was trained on the wording of {len(leaks)} "
                f"hand-written eval items (first: {item!r} shares {words!r}); train one on a snapshot that keeps "
                "them apart (lifecycle safety-classifier train), or evaluate the model alone"
            )
    return EndpointScreen(filters)
