"""The stage functions the CLI commands and the Prefect tasks both call (no Prefect here).

Each takes the root config and the home folder, calls one stage's core function, and returns its typed result.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.errors import NotFoundError
from core.home import Home
from flows.config import LifecycleConfig
from training.modelio import ModelFolder
from training.snapshot import Snapshot

if TYPE_CHECKING:
    from evals.gate import GateDecision, GatePolicy
    from evals.report import EvalReport, SuiteResult
    from evals.runner import ModelTarget
    from evals.sets import EvalSets, Suite
    from registry.store import MlflowRegistry, ModelVersion
    from training.finetune import TrainResult

CANDIDATE = "candidate"  # alias of the newest trained version, before any gate has looked at it


def preflight(cfg: LifecycleConfig, home: Home, snapshot_ref: str | None = None) -> None:
    """Check what the user controls before any orchestration starts, so bad input is one clear line."""
    from training.finetune import resolve_deepspeed_config
    from training.snapshot import load_snapshot, source_files

    resolve_deepspeed_config(cfg.finetune)
    if cfg.base_model:
        _base_folder(cfg, home)
    if snapshot_ref:
        load_snapshot(home.snapshots, snapshot_ref)
    elif cfg.data.sources:
        source_files([Path(s).expanduser().resolve() for s in cfg.data.sources])


def snapshot_stage(cfg: LifecycleConfig, home: Home, snapshot_ref: str | None = None) -> Snapshot:
    """An existing snapshot by hash (prefix), or the one the configured sources make (built if new)."""
    if snapshot_ref:
        from training.snapshot import load_snapshot

        return load_snapshot(home.snapshots, snapshot_ref)
    from training.dataset import make_snapshot

    return make_snapshot(cfg.data, cfg.snapshot, home)


def _is_registry_ref(value: str) -> bool:
    from registry.store import REF_PATTERN

    return not Path(value).expanduser().exists() and REF_PATTERN.match(value.strip()) is not None


def _base_folder(cfg: LifecycleConfig, home: Home) -> ModelFolder:
    """``base_model`` as a local folder, or as a registered version (``chat-base/1``, ``chat-base@prod``)
    downloaded once into the home cache: retraining on a new snapshot then keeps the same base."""
    from training.modelio import inspect_model_folder

    assert cfg.base_model
    if _is_registry_ref(cfg.base_model):
        return inspect_model_folder(open_registry(cfg, home).resolve(cfg.base_model))
    return inspect_model_folder(Path(cfg.base_model).expanduser().resolve())


def base_model_stage(
    cfg: LifecycleConfig, home: Home, snapshot: Snapshot | None, *, progress: bool = True
) -> ModelFolder:
    """The configured base model (folder or registered version), or the one bootstrapped from ``snapshot``
    (trained only if new)."""
    if cfg.base_model:
        return _base_folder(cfg, home)
    assert snapshot is not None, "bootstrapping a base model needs the snapshot it learns from"
    from training.bootstrap import bootstrap

    return bootstrap(cfg.bootstrap, snapshot, home.base_models, progress=progress)


def open_registry(cfg: LifecycleConfig, home: Home) -> MlflowRegistry:
    from registry.store import MlflowRegistry

    return MlflowRegistry(cfg.registry, home)


def _base_identity(base: ModelFolder) -> dict[str, str]:
    """Weights and tokenizer hashes of a base model, from its manifest or computed for an external folder."""
    from training.tokenizer import tokenizer_hashes

    tokenizer = (
        {k: str(base.manifest[k]) for k in ("tokenizer_hash", "chat_template_hash")}
        if base.manifest.get("tokenizer_hash")
        else tokenizer_hashes(base.path)
    )
    return {"weights_hash": base.identity, **tokenizer}


def register_base_stage(cfg: LifecycleConfig, home: Home, base: ModelFolder, *, flow_run_id: str) -> ModelVersion:
    from core.provenance import git_sha
    from registry.lineage import register_base_model

    curve_file = base.path / "loss_curve.json"
    curve = json.loads(curve_file.read_text())["train"] if curve_file.is_file() else []
    manifest = {"kind": "external", **base.manifest, **_base_identity(base)}
    return register_base_model(
        open_registry(cfg, home),
        folder=base.path,
        manifest=manifest,
        curve=curve,
        git_sha=git_sha(),
        flow_run_id=flow_run_id,
    )


def train_run_dir(cfg: LifecycleConfig, home: Home, snapshot: Snapshot, base: ModelFolder) -> Path:
    """``$LIFECYCLE_HOME/models/runs/<train key>``: the one folder of a fine-tune's checkpoints, logs and export."""
    from training.finetune import train_key

    return home.runs / train_key(cfg.finetune, snapshot, base)


def finetune_stage(cfg: LifecycleConfig, home: Home, snapshot: Snapshot, base: ModelFolder) -> TrainResult:
    """Fine-tune in its run folder (``train_run_dir``): a rerun resumes or returns the finished run."""
    from training.finetune import finetune

    return finetune(cfg.finetune, snapshot, base, train_run_dir(cfg, home, snapshot, base))


def register_stage(
    cfg: LifecycleConfig,
    home: Home,
    snapshot: Snapshot,
    base: ModelFolder,
    base_version: ModelVersion,
    result: TrainResult,
    *,
    flow_run_id: str,
) -> ModelVersion:
    """Log the training run, register the version with its lineage and point ``candidate`` at it."""
    from core.config import dump_yaml
    from core.hashing import sha256_json
    from core.provenance import git_sha
    from registry.lineage import Lineage, register
    from training.finetune import resolve_deepspeed_config, train_key
    from training.tokenizer import tokenizer_hashes

    reg = open_registry(cfg, home)
    key = train_key(cfg.finetune, snapshot, base)
    existing = reg.find(cfg.registry.model_name, lineage_train_key=key)
    if existing:
        return existing[0]
    ds_path, ds = resolve_deepspeed_config(cfg.finetune)
    lineage = Lineage(
        snapshot=snapshot.hash,
        base_model=base_version.ref,
        base_weights_hash=_base_identity(base)["weights_hash"],
        config_hash=cfg.finetune.config_hash(),
        deepspeed_config=ds_path.name,
        deepspeed_config_hash=sha256_json(ds),
        seed=cfg.finetune.seed,
        git_sha=git_sha(),
        **tokenizer_hashes(result.export_dir),
        weights_hash=result.weights_hash,
        flow_run_id=flow_run_id,
        method=result.method,
        train_key=key,
    )
    run_dir = result.run_dir
    (run_dir / "config.yaml").write_text(dump_yaml(cfg), encoding="utf-8")
    (run_dir / "deepspeed.json").write_text(json.dumps(ds, indent=2) + "\n", encoding="utf-8")
    metrics = result.metrics
    summary = {
        "metrics.val_loss": f"{metrics['val_loss']:.4f}",
        "metrics.val_loss_initial": f"{metrics['val_loss_initial']:.4f}",
        "metrics.tokens_per_s": f"{metrics['tokens_per_s']:.0f}",
        "check.max_abs_logit_diff": f"{result.equivalence['max_abs_logit_diff']:.3g}",
        "check.atol": str(result.equivalence["atol"]),
    }
    version = register(
        reg,
        lineage=lineage,
        export_dir=result.export_dir,
        config=cfg.model_dump(mode="json"),
        curve=result.curve(),
        artifacts={
            "config": run_dir / "config.yaml",
            "deepspeed": run_dir / "deepspeed.json",
            "snapshot": snapshot.path / "manifest.json",
            "training": run_dir / "train_result.json",
            "logs": run_dir / "logs",
        },
        summary=summary,
    )
    reg.set_alias(
        version.name,
        CANDIDATE,
        version.version,
        actor=f"flow-run:{flow_run_id}",
        reason=f"fine-tuned ({result.method}) on snapshot {snapshot.short}; awaiting the eval gate",
    )
    return reg.get(version.name, version.version)


# --- evaluation and the gate ------------------------------------------------------------------------------

CHAMPION = "champion"


@dataclass(frozen=True)
class GateOutcome:
    version: ModelVersion
    decision: GateDecision
    report: EvalReport
    champion_report: EvalReport | None
    run_id: str
    markdown: str
    files: dict[str, Path]


def eval_suites(cfg: LifecycleConfig) -> list[Suite]:
    from evals.config import load_suite

    return [load_suite(s) for s in cfg.evals.suites]


def gate_policy(cfg: LifecycleConfig) -> GatePolicy:
    from evals.config import REPO
    from evals.gate import load_policy

    path = Path(cfg.evals.gate)
    return load_policy(path if path.is_absolute() else REPO / path)


def eval_sets_stage(cfg: LifecycleConfig, home: Home, snapshot_ref: str) -> EvalSets:
    """The held-out eval sets of a snapshot (built once per snapshot, generator config, suites and seed)."""
    from evals.sets import build_eval_sets
    from training.snapshot import load_snapshot

    snapshot = load_snapshot(home.snapshots, snapshot_ref)
    return build_eval_sets(snapshot, cfg.data.generator, eval_suites(cfg), seed=cfg.evals.seed, root=home.eval_sets)


def eval_target(cfg: LifecycleConfig, home: Home, ref: str) -> tuple[ModelVersion, ModelTarget]:
    """A registered version as something vLLM can load: a full folder, or a LoRA adapter on its base."""

    mv = open_registry(cfg, home).parse(ref)
    return mv, _target(cfg, home, mv)


def _model_id(mv: ModelVersion) -> str:
    return mv.lineage.get("weights_hash") or mv.ref


def _target(cfg: LifecycleConfig, home: Home, mv: ModelVersion) -> ModelTarget:
    from evals.runner import ModelTarget

    reg = open_registry(cfg, home)
    folder = reg.resolve(mv.ref)
    model_id = _model_id(mv)
    if (folder / "adapter_config.json").is_file():
        from training.modelio import merge_adapter

        base_ref = mv.lineage.get("base_model")
        if not base_ref:
            raise NotFoundError(f"{mv.ref} is a LoRA adapter without a lineage.base_model tag; cannot load its base")
        # merged once per weights hash: vLLM's CPU LoRA path cannot score prompt logprobs (see merge_adapter)
        folder = merge_adapter(reg.resolve(base_ref), folder, home.cache / "merged" / model_id[:16])
    return ModelTarget(label=mv.ref, model_id=model_id, folder=folder)


def evaluate_stage(
    cfg: LifecycleConfig,
    home: Home,
    ref: str,
    *,
    sets: EvalSets | None = None,
    force: bool = False,
    on_suite: Callable[[SuiteResult], None] | None = None,
) -> EvalReport:
    """Run the suites on a registered version, on ``sets`` (default: its own snapshot's). Reports are kept
    per (weights, eval sets) under ``reports/evals``; a rerun returns the stored one unless ``force``."""
    from evals.report import load_report
    from evals.runner import run_eval

    mv = open_registry(cfg, home).parse(ref)
    if sets is None:
        snapshot = mv.lineage.get("snapshot")
        if not snapshot:
            raise NotFoundError(f"{mv.ref} has no lineage.snapshot tag; pass the eval sets explicitly")
        sets = eval_sets_stage(cfg, home, snapshot)
    path = home.reports / "evals" / f"{mv.name}-{mv.version}" / f"{sets.hash[:16]}-{cfg.evals.config_hash()[:8]}.json"
    if path.is_file() and not force:
        report = load_report(path)
        if report.model_id == _model_id(mv):
            return report  # found before any download, LoRA merge or engine start
    report = run_eval(cfg.evals, _target(cfg, home, mv), sets, eval_suites(cfg), on_suite=on_suite)
    report.save(path)
    return report


def _champion(cfg: LifecycleConfig, home: Home, candidate: ModelVersion) -> ModelVersion | None:
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
    """Evaluate a version (and the champion, on the same items), decide, and record the decision: ``gate.*``
    tags, an MLflow run with the reports, files under ``reports/gates``. A failed version loses the
    ``candidate`` alias, so nothing downstream picks it up."""
    from evals.gate import decide, render_markdown
    from registry.gate import GateRecord, record_gate

    reg = open_registry(cfg, home)
    mv = reg.parse(ref)
    snapshot = mv.lineage.get("snapshot")
    if not snapshot:
        raise NotFoundError(f"{mv.ref} has no lineage.snapshot tag; the gate needs its held-out data")
    policy = gate_policy(cfg)
    sets = eval_sets_stage(cfg, home, snapshot)
    report = evaluate_stage(cfg, home, mv.ref, sets=sets, force=force, on_suite=on_suite)
    champion = _champion(cfg, home, mv)
    champion_report = (
        evaluate_stage(cfg, home, champion.ref, sets=sets, force=force, on_suite=on_suite) if champion else None
    )
    decision = decide(report, champion_report, policy)
    markdown = render_markdown(decision, report)
    folder = home.reports / "gates" / f"{mv.name}-{mv.version}"
    if folder.exists():  # a re-gate replaces the previous files (the MLflow runs keep every decision)
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    files = {
        "decision": folder / "gate.json",
        "markdown": folder / "gate.md",
        "report": folder / "report.json",
    }
    files["decision"].write_text(json.dumps(decision.to_json(), indent=2) + "\n", encoding="utf-8")
    files["markdown"].write_text(markdown, encoding="utf-8")
    report.save(files["report"])
    if champion_report is not None:
        files["champion_report"] = champion_report.save(folder / "champion_report.json")
    artifacts = {"gate": folder}  # gate.json, gate.md, report.json (+ champion_report.json)
    record = GateRecord(
        passed=decision.passed,
        summary=decision.summary,
        failing=decision.failing,
        policy=decision.policy,
        policy_hash=decision.policy_hash,
        champion=decision.champion,
        eval_sets=decision.eval_sets,
        verdicts={v.metric: f"{'-' if v.value is None else f'{v.value:.4g}'} {v.verdict}" for v in decision.verdicts},
        metrics=report.summary(),
        params={"snapshot": snapshot, "seed": str(cfg.evals.seed), "suites": ",".join(cfg.evals.suites)},
        artifacts=artifacts,
    )
    run_id = record_gate(reg, mv.name, mv.version, record, actor=actor)
    if not decision.passed and CANDIDATE in mv.aliases:
        reg.remove_alias(mv.name, CANDIDATE, reason=f"gate {decision.summary}", actor=actor)
    return GateOutcome(reg.get(mv.name, mv.version), decision, report, champion_report, run_id, markdown, files)


@dataclass(frozen=True)
class ChampionCheck:
    version: ModelVersion
    decision: Any  # evals.gate.GateDecision: the gate policy's floors on fresh numbers (no champion to compare)
    run_id: str
    markdown: str

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
    from evals.gate import decide, render_markdown

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
    reg.set_tags(
        mv.name,
        mv.version,
        {
            "eval.daily.status": status,
            "eval.daily.at": at,
            "eval.daily.failing": ",".join(decision.failing) or "-",
            "eval.daily.run_id": run_id,
        },
    )
    return ChampionCheck(reg.get(mv.name, mv.version), decision, run_id, render_markdown(decision, report))
