"""The safety classifier's commands: ``safety-classifier train|gate|promote|canary|rollback|review|feedback``.

One command with an action, so the classifier's lifecycle reads as one group in ``lifecycle --help``; each action
calls the same adapters the ``safety-classifier`` flow does (``flows.classifier_stages``).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from core.errors import ConfigError
from flows.commands.base import Arg, Context, command, say

ACTIONS = ("train", "gate", "promote", "canary", "rollback", "review", "feedback")


@command(
    "safety-classifier",
    help="the harm-intent classifier of the pre-filter: train (snapshot, train, register, gate; a Prefect flow), "
    "gate a version, promote it to champion (the gateway follows the alias) or into a canary beside the champion "
    "(promote --canary), decide the canary from live traffic (canary: promote, roll back or hold), roll back, "
    "or list/export the "
    "human-review queue of its high-stakes blocks, or export what feedback proposes for its next training data "
    "(refusals users disputed, answers users rated unsafe) for a person to review",
    example="lifecycle safety-classifier train\n"
    "  lifecycle safety-classifier train --source red_team.jsonl\n"
    "  lifecycle safety-classifier promote safety-classifier/2\n"
    "  lifecycle safety-classifier promote safety-classifier/3 --canary   # then, on a schedule:\n"
    "  lifecycle safety-classifier canary\n"
    "  lifecycle safety-classifier rollback --reason 'false blocks on cooking questions'\n"
    "  lifecycle safety-classifier review --export review.jsonl\n"
    "  lifecycle safety-classifier feedback --export disputed.jsonl   # review it, then: train --source",
    args=[
        Arg("action", choices=ACTIONS, help="what to do"),
        Arg("ref", nargs="?", help="gate/promote: the version (safety-classifier/2, safety-classifier@candidate)"),
        Arg("--source", metavar="PATH", action="append", default=[], help="train: add a JSONL of labelled prompts"),
        Arg("--snapshot", metavar="HASH", help="train: on this existing harm snapshot"),
        Arg("--no-gate", action="store_true", help="train: register without gating"),
        Arg("--force", action="store_true", help="promote: without a passing gate record (recorded as such)"),
        Arg(
            "--canary",
            action="store_true",
            help="promote: into a canary (the serving.safety.classifier_canary alias) instead of champion",
        ),
        Arg("--reason", default="manual rollback", help="rollback: why (tagged on the rolled-back version)"),
        Arg("--category", help="review: only this category"),
        Arg("--export", metavar="FILE", help="review: write the queue as JSONL to FILE; feedback: the proposals"),
    ],
)
def safety_classifier(ctx: Context) -> int:
    from flows import classifier_stages as stages

    args, cfg = ctx.args, ctx.config
    actor = "cli"
    if args.action == "train":
        from flows.safety_classifier import safety_classifier_flow

        if args.source:
            c = cfg.safety_classifier
            cfg = cfg.model_copy(
                update={"safety_classifier": c.model_copy(update={"sources": c.sources + args.source})}
            )
        if not args.snapshot:
            stages.fetch_prompt_sets(cfg, ctx.home)
        summary = safety_classifier_flow(cfg, ctx.home, args.snapshot, not args.no_gate)
        gate = "not gated" if summary.gate_passed is None else summary.gate_summary
        ctx.emit(
            asdict(summary),
            [
                f"{summary.model}/{summary.version}  snapshot {summary.snapshot[:12]}  "
                f"threshold {summary.threshold:.3f}",
                f"  gate: {gate}",
                *(f"  {k:<40} {v:.3f}" for k, v in summary.metrics.items()),
            ],
        )
        return 0
    if args.action in ("gate", "promote") and not args.ref:
        raise ConfigError(f"lifecycle safety-classifier {args.action} needs a version (safety-classifier/2)")
    if args.action == "gate":
        outcome = stages.classifier_gate_stage(cfg, ctx.home, args.ref, actor=actor)
        ctx.emit(
            {"model": outcome.version.ref, "passed": outcome.decision.passed, "summary": outcome.decision.summary},
            [outcome.markdown],
        )
        return 0 if outcome.decision.passed else 1
    if args.action == "promote" and args.canary:
        reason = stages.start_canary_stage(cfg, ctx.home, args.ref, actor=actor, force=args.force)
        alias = stages.canary_alias(cfg)
        ctx.emit(
            {"canary": args.ref, "alias": alias, "reason": reason},
            [f"{args.ref} is now {alias}: gateways judge with it beside the champion ({reason})"],
        )
        return 0
    if args.action == "promote":
        reason = stages.promote_classifier_stage(cfg, ctx.home, args.ref, actor=actor, force=args.force)
        ctx.emit({"champion": args.ref, "reason": reason}, [f"{args.ref} is now champion ({reason})"])
        return 0
    if args.action == "canary":
        from flows.safety_classifier import safety_classifier_canary_flow

        canary = safety_classifier_canary_flow(cfg, ctx.home)
        head = f"canary {canary.canary or '-'} vs champion {canary.champion or '-'}: {canary.action}"
        ctx.emit(asdict(canary), [head, f"  {canary.reason}", *(f"  {k:<28} {v}" for k, v in canary.stats.items())])
        return 1 if canary.action in ("rollback", "rejected") else 0
    if args.action == "rollback":
        restored = stages.rollback_classifier_stage(cfg, ctx.home, reason=args.reason, actor=actor)
        ctx.emit({"champion": restored.ref}, [f"champion is {restored.ref} again"])
        return 0
    if args.action == "feedback":
        proposals = stages.feedback_proposals_stage(cfg, ctx.home)
        if args.export:
            Path(args.export).write_text(
                "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in proposals), encoding="utf-8"
            )
            say(f"{len(proposals)} proposal(s) written to {args.export}: review them, then train with --source")
        ctx.emit(
            {"proposals": proposals},
            [
                f"{p['rated_at']}  {p['source']:<24} {p['label'] or '(no label)':<10} {p['classifier']}  "
                f"{p['text'][:60]!r}"
                for p in proposals
            ]
            or [
                "no proposal (a classifier refusal rated thumbs-down, or an answer rated thumbs-down as unsafe, by a "
                "key opted in to training)"
            ],
        )
        return 0
    from serving.state.review import ReviewQueue

    queue = ReviewQueue(ctx.home.serving / "review.jsonl")
    if args.export:
        n = queue.export(Path(args.export), args.category)
        say(f"{n} item(s) written to {args.export}")
    items = queue.items(args.category)
    ctx.emit(
        {"items": [asdict(i) for i in items]},
        [f"{i.at}  {i.category:<10} {i.score:.2f}  {i.classifier}  {i.request_id}  {i.prompt[:60]!r}" for i in items]
        or ["the review queue is empty"],
    )
    return 0
