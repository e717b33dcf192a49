"""The evaluation and gate adapters (no Prefect here): eval sets, suites on a registered version, the gate decision
recorded on it, and the champion's daily re-evaluation.

    gate_stage(cfg, home, "chat/3", actor="cli:me")      # evaluate chat/3 and the champion, decide, record
    champion_eval_stage(cfg, home, actor="flow-run:...")  # the champion again, judged by the policy's floors

The decision itself is ``evals.gate.decide`` (pure); recording it is ``registry.gate.record_gate``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from core.errors import NotFoundError
from core.hashing import sha256_text
from core.home import Home
from evals.compare import PairedComparison, compare, render_comparison
from evals.config import REPO, load_suite
from evals.gate import GateDecision, GatePolicy, decide, load_policy, render_markdown
from evals.generation import OpenAIChat
from evals.parity import ParityReport, endpoint_greedy, offline_greedy, online_greedy, parity, parity_prompts
from evals.report import EvalReport, SuiteResult, load_report
from evals.runner import ModelTarget, UrlTarget, chat_model, run_eval
from evals.sets import EvalSets, Suite, build_eval_sets
from flows.config import LifecycleConfig
from flows.served import endpoint_screen
from flows.stages import CANDIDATE, CHAMPION, open_registry
from monitoring.alerts import eval_drop_alert, eval_drops, post_alert
from registry.gate import GateRecord, record_gate
from registry.store import REF_PATTERN, ModelVersion
from training.data.snapshot import load_snapshot
from training.model.modelio import merge_adapter


@dataclass(frozen=True)
class Reference:
    """A version the gate report compares the gated one with (``evals.references``), paired on the same items."""

    tag: str  # the lineage tag that names it (base_model, ...)
    ref: str  # chat-base/1
    report: EvalReport
    rows: list[PairedComparison]


@dataclass(frozen=True)
class GateOutcome:
    version: ModelVersion
    decision: GateDecision
    report: EvalReport
    champion_report: EvalReport | None
    run_id: str
    markdown: str
    files: dict[str, Path]
    references: list[Reference] = field(default_factory=list)


def eval_suites(cfg: LifecycleConfig) -> list[Suite]:
    return [load_suite(s) for s in cfg.evals.suites]


def gate_policy(cfg: LifecycleConfig) -> GatePolicy:
    path = Path(cfg.evals.gate)
    return load_policy(path if path.is_absolute() else REPO / path)


def eval_sets_stage(cfg: LifecycleConfig, home: Home, snapshot_ref: str) -> EvalSets:
    """The held-out eval sets of a snapshot (built once per snapshot, generator config, suites and seed)."""
    snapshot = load_snapshot(home.snapshots, snapshot_ref)
    return build_eval_sets(snapshot, cfg.data.generator, eval_suites(cfg), seed=cfg.evals.seed, root=home.eval_sets)


def eval_target(cfg: LifecycleConfig, home: Home, ref: str) -> tuple[ModelVersion, ModelTarget]:
    """A registered version as something vLLM can load: a full folder, or a LoRA adapter on its base."""
    mv = open_registry(cfg, home).parse(ref)
    return mv, _target(cfg, home, mv)


def _model_id(mv: ModelVersion) -> str:
    return mv.lineage.get("weights_hash") or mv.ref


def _target(cfg: LifecycleConfig, home: Home, mv: ModelVersion) -> ModelTarget:
    reg = open_registry(cfg, home)
    folder = reg.resolve(mv.ref)
    model_id = _model_id(mv)
    if (folder / "adapter_config.json").is_file():
        base_ref = mv.lineage.get("base_model")
        if not base_ref:
            raise NotFoundError(f"{mv.ref} is a LoRA adapter without a lineage.base_model tag; cannot load its base")
        # merged once per weights hash: vLLM's CPU LoRA path cannot score prompt logprobs (see merge_adapter)
        folder = merge_adapter(reg.resolve(base_ref), folder, home.cache / "merged" / model_id[:16])
    return ModelTarget(label=mv.ref, model_id=model_id, folder=folder)


def parity_stage(
    cfg: LifecycleConfig, home: Home, ref: str, *, prompts: int, max_tokens: int, url: UrlTarget | None = None
) -> ParityReport:
    """A version's greedy answers from the serving side (``url``, or a vLLM engine in ``serving.engine.dtype``, the
    precision the endpoint serves) against transformers' fp32 ones; the report is kept under ``reports/parity``."""
    mv = open_registry(cfg, home).parse(ref)
    target = _target(cfg, home, mv)
    asked = parity_prompts(prompts)
    offline = offline_greedy(target.folder, asked, max_tokens)
    filtered: list[str] = []
    if url is not None:
        endpoint = OpenAIChat(url.base_url, url.model, url.api_key, url.concurrency)
        online, filtered = endpoint_greedy(endpoint, asked, max_tokens)
    else:
        from serving.engines.engine import engine_dtype

        engine = cfg.evals.engine.model_copy(update={"dtype": engine_dtype(cfg.serving.engine.dtype)})
        with chat_model(cfg.evals.model_copy(update={"engine": engine}), target) as chat:
            online = online_greedy(chat, asked, max_tokens)
    report = parity(asked, offline, online, max_tokens, filtered)
    path = home.reports / "parity" / f"{mv.name}-{mv.version}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"model": mv.ref, "online": url.base_url if url else "vllm", **report.to_json()}, indent=2)
    )
    return report


def evaluate_stage(
    cfg: LifecycleConfig,
    home: Home,
    ref: str,
    *,
    sets: EvalSets | None = None,
    force: bool = False,
    on_suite: Callable[[SuiteResult], None] | None = None,
) -> EvalReport:
    """Run the suites on a registered version, on ``sets`` (default: its own snapshot's); with ``evals.as_served``
    behind the endpoint's safety filters (``flows.served``). Reports are kept per (weights, eval sets, eval config,
    filters) under ``reports/evals``; a rerun returns the stored one unless ``force``."""
    reg = open_registry(cfg, home)
    mv = reg.parse(ref)
    if sets is None:
        snapshot = mv.lineage.get("snapshot")
        if not snapshot:
            raise NotFoundError(f"{mv.ref} has no lineage.snapshot tag; pass the eval sets explicitly")
        sets = eval_sets_stage(cfg, home, snapshot)
    suites = eval_suites(cfg)
    screen = endpoint_screen(cfg, home, reg, suites) if cfg.evals.as_served else None
    key = f"{sets.hash[:16]}-{cfg.evals.config_hash()[:8]}" + (f"-{sha256_text(screen.identity)[:8]}" if screen else "")
    path = home.reports / "evals" / f"{mv.name}-{mv.version}" / f"{key}.json"
    if path.is_file() and not force:
        report = load_report(path)
        if report.model_id == _model_id(mv):
            return report  # found before any download, LoRA merge or engine start
    report = run_eval(cfg.evals, _target(cfg, home, mv), sets, suites, on_suite=on_suite, screen=screen)
    report.save(path)
    return report


def gate_baseline(cfg: LifecycleConfig, home: Home, candidate: ModelVersion) -> ModelVersion | None:
    """The version a candidate is judged against: the champion, or for a quantized variant its parent (same
    weights but for the quantization: the gate asks what quantizing cost, paired on the same items)."""
    parent = candidate.lineage.get("parent")
    if candidate.lineage.get("kind") == "quantized" and parent:
        return open_registry(cfg, home).parse(parent)
    try:
        champ = open_registry(cfg, home).by_alias(candidate.name, CHAMPION)
    except NotFoundError:
        return None
    return None if champ.version == candidate.version else champ


def gate_stage(
    cfg: LifecycleConfig,
    home: Home,
    ref: str,
    *,
    actor: str,
    force: bool = False,
    on_suite: Callable[[SuiteResult], None] | None = None,
) -> GateOutcome:
    """Evaluate a version (and the champion, or a quantized version's parent, on the same items), decide, and
    record the decision: ``gate.*`` tags, an MLflow run with the reports, files under ``reports/gates``. A failed
    version loses the ``candidate`` alias, so nothing downstream picks it up."""
    reg = open_registry(cfg, home)
    mv = reg.parse(ref)
    snapshot = mv.lineage.get("snapshot")
    if not snapshot:
        raise NotFoundError(f"{mv.ref} has no lineage.snapshot tag; the gate needs its held-out data")
    policy = gate_policy(cfg)
    sets = eval_sets_stage(cfg, home, snapshot)
    report = evaluate_stage(cfg, home, mv.ref, sets=sets, force=force, on_suite=on_suite)
    champion = gate_baseline(cfg, home, mv)
    champion_report = (
        evaluate_stage(cfg, home, champion.ref, sets=sets, force=force, on_suite=on_suite) if champion else None
    )
    decision = decide(report, champion_report, policy)
    references = _references(cfg, home, mv, report, sets, policy, force=force, on_suite=on_suite)
    markdown = render_markdown(decision, report) + "".join(
        "\n" + render_comparison(f"Against {r.tag} {r.ref}", r.ref, r.rows, policy.bootstrap.confidence)
        for r in references
    )
    folder = home.reports / "gates" / f"{mv.name}-{mv.version}"
    if folder.exists():  # a re-gate replaces the previous files (the MLflow runs keep every decision)
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    files = {
        "decision": folder / "gate.json",
        "markdown": folder / "gate.md",
        "report": folder / "report.json",
    }
    gate_json = {**decision.to_json(), "references": [reference_json(r) for r in references]}
    files["decision"].write_text(json.dumps(gate_json, indent=2) + "\n", encoding="utf-8")
    files["markdown"].write_text(markdown, encoding="utf-8")
    report.save(files["report"])
    if champion_report is not None:
        files["champion_report"] = champion_report.save(folder / "champion_report.json")
    for r in references:
        files[f"{r.tag}_report"] = r.report.save(folder / f"{r.tag}_report.json")
    artifacts = {"gate": folder}  # gate.json, gate.md, report.json (+ champion_report.json)
    params = {"snapshot": snapshot, "seed": str(cfg.evals.seed), "suites": ",".join(cfg.evals.suites)}
    if report.served is not None:
        params["as_served"] = report.served.filters
    record = gate_record(decision, report, params, artifacts)
    run_id = record_gate(reg, mv.name, mv.version, record, actor=actor)
    if not decision.passed and CANDIDATE in mv.aliases:
        reg.remove_alias(mv.name, CANDIDATE, reason=f"gate {decision.summary}", actor=actor)
    return GateOutcome(
        reg.get(mv.name, mv.version), decision, report, champion_report, run_id, markdown, files, references
    )


def gate_record(
    decision: GateDecision, report: EvalReport, params: dict[str, str], artifacts: dict[str, Path]
) -> GateRecord:
    """What ``registry.gate.record_gate`` keeps of a decision: tags, the report's metrics, the files."""
    return GateRecord(
        passed=decision.passed,
        summary=decision.summary,
        failing=decision.failing,
        policy=decision.policy,
        policy_hash=decision.policy_hash,
        champion=decision.champion,
        eval_sets=decision.eval_sets,
        verdicts={v.metric: f"{'-' if v.value is None else f'{v.value:.4g}'} {v.verdict}" for v in decision.verdicts},
        metrics=report.summary(),
        params=params,
        artifacts=artifacts,
    )


def _references(
    cfg: LifecycleConfig,
    home: Home,
    mv: ModelVersion,
    report: EvalReport,
    sets: EvalSets,
    policy: GatePolicy,
    *,
    force: bool,
    on_suite: Callable[[SuiteResult], None] | None,
) -> list[Reference]:
    """The versions ``evals.references`` names through ``mv``'s lineage, evaluated on the same sets (stored reports
    are reused: a base model is evaluated once for all the versions trained from it) and compared pair by pair.
    A lineage value that is not a registered version (an external base folder) is skipped."""
    out = []
    reg = open_registry(cfg, home)
    for tag in cfg.evals.references:
        ref = mv.lineage.get(tag)
        if not ref or not REF_PATTERN.match(ref):
            continue
        other = evaluate_stage(cfg, home, ref, sets=sets, force=force, on_suite=on_suite)
        out.append(Reference(tag, reg.parse(ref).ref, other, compare(report, other, policy.bootstrap)))
    return out


def reference_json(r: Reference) -> dict[str, object]:
    rows = [{**asdict(c), "direction": c.direction} for c in r.rows]
    return {"tag": r.tag, "ref": r.ref, "rows": rows}


@dataclass(frozen=True)
class ChampionCheck:
    version: ModelVersion
    decision: GateDecision  # the gate policy's floors on fresh numbers (no champion to compare)
    run_id: str
    markdown: str
    drops: dict[str, float] = field(default_factory=dict)  # metric -> relative drop since the last daily eval

    @property
    def status(self) -> str:
        return "ok" if self.decision.passed else "regressed"


def champion_eval_stage(cfg: LifecycleConfig, home: Home, *, actor: str, force: bool = True) -> ChampionCheck:
    """The champion through the suites again, on its own held-out sets, judged by the gate policy's floors.

    The result is tagged on the version (``eval.daily.status`` ok | regressed, ``eval.daily.failing``) and logged
    as an MLflow run; a regression is *reported*, not acted on: the champion's gate record stays as it was (else
    the rollout controller's champion guard would move the champion on a possibly transient eval failure), and
    moving it is a reviewer's call or a rollout's. ``force`` re-runs the suites instead of reusing the stored
    report (the point of a daily run: the environment, not the weights, may have changed)."""
    reg = open_registry(cfg, home)
    mv = reg.by_alias(cfg.registry.model_name, CHAMPION)
    report = evaluate_stage(cfg, home, mv.ref, force=force)
    decision = decide(report, None, gate_policy(cfg))
    status = "ok" if decision.passed else "regressed"
    at = datetime.now(UTC).isoformat(timespec="seconds")
    run_id = reg.log_run(
        run_name=f"champion-eval {mv.ref}",
        params={"model": mv.ref, "policy": decision.policy, "eval_sets": decision.eval_sets},
        metrics=[{"step": 0, **report.summary()}],
        artifacts={},
        tags={"lifecycle.kind": "champion-eval", "eval.model": mv.ref, "eval.status": status, "eval.actor": actor},
    )
    values = {v.metric: v.value for v in decision.verdicts if v.value is not None}
    drops = daily_drops(cfg, mv, values, {v.metric: v.higher_is_better for v in decision.verdicts})
    reg.set_tags(
        mv.name,
        mv.version,
        {
            "eval.daily.status": status,
            "eval.daily.at": at,
            "eval.daily.failing": ",".join(decision.failing) or "-",
            "eval.daily.run_id": run_id,
            "eval.daily.metrics": json.dumps(values, sort_keys=True)[:4900],
            "eval.daily.drops": json.dumps(drops, sort_keys=True)[:4900],
        },
    )
    check = ChampionCheck(reg.get(mv.name, mv.version), decision, run_id, render_markdown(decision, report), drops)
    return check


def daily_drops(
    cfg: LifecycleConfig, mv: ModelVersion, values: dict[str, float], directions: dict[str, bool | None]
) -> dict[str, float]:
    """The metrics that dropped beyond ``monitoring.watch.eval_drop`` since the champion's last daily eval; when
    any did and Alertmanager is configured, a ChampionEvalDrop alert is posted there (monitoring/alerts.py says
    why a post and not a scraped metric). A failed post is logged, never fatal: the tags still say it."""
    watch = cfg.monitoring.watch
    previous = json.loads(mv.tags.get("eval.daily.metrics") or "{}")
    known = {k: d for k, d in directions.items() if d is not None}
    drops = eval_drops(previous, values, known, watch.eval_drop)
    if drops and watch.alertmanager_url:
        post_alert(watch.alertmanager_url, eval_drop_alert(mv.ref, drops, watch.eval_drop))
    return drops
