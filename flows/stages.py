"""The stage adapters the flows and the CLI call (no Prefect here): data, base model, self-replies, fine-tune,
registration, and the two handles every later stage opens, the registry and the serving database.

Each function takes the root config and the home folder, calls one stage's core function, and returns its typed
result. The evaluation and gate adapters are in ``flows.gating``; curation in ``flows.curation``; the drift check
and the retrain decision in ``flows.signals``.
"""

from __future__ import annotations

import json
from pathlib import Path

from core.config import dump_yaml
from core.hashing import sha256_json
from core.home import Home
from core.provenance import git_sha
from evals.config import load_suite
from evals.runner import ModelTarget, chat_model
from evals.sets import hand_written_prompts
from flows.config import LifecycleConfig
from registry.lineage import Lineage, register, register_base_model
from registry.store import REF_PATTERN, MlflowRegistry, ModelVersion
from serving.runtime import ServeSpec, database_url
from serving.state.store import ServingStore
from training.config import SFT_PARENT
from training.data.dataset import make_snapshot
from training.data.self_replies import derive_snapshot
from training.data.snapshot import Snapshot, load_snapshot, source_files
from training.finetune.launch import TrainResult, finetune, resolve_deepspeed_config, train_key
from training.model.bootstrap import bootstrap
from training.model.modelio import ModelFolder, inspect_model_folder
from training.model.pretrained import import_base, is_import_source
from training.model.tokenizer import tokenizer_hashes

CANDIDATE = "candidate"  # alias of the newest trained version, before any gate has looked at it
CHAMPION = "champion"  # alias of the version serving 100% minus the canary


def open_registry(cfg: LifecycleConfig, home: Home) -> MlflowRegistry:
    return MlflowRegistry(cfg.registry, home)


def serve_spec(cfg: LifecycleConfig, home: Home) -> ServeSpec:
    """The serving part of the root config, as the BentoML service reads it (the gateway's own view: its database
    and its served model name)."""
    return ServeSpec(
        home=str(home.root),
        serving=cfg.serving,
        registry=cfg.registry,
        model_name=cfg.serving.routing.model_name or cfg.registry.model_name,
    )


def open_serving_store(cfg: LifecycleConfig, home: Home) -> ServingStore:
    """The serving database ``lifecycle serve`` uses (keys, conversations, the request log)."""
    return ServingStore(database_url(serve_spec(cfg, home)))


def preflight(cfg: LifecycleConfig, home: Home, snapshot_ref: str | None = None) -> None:
    """Check what the user controls before any orchestration starts, so bad input is one clear line."""
    resolve_deepspeed_config(cfg.finetune)
    if cfg.base_model:
        _base_folder(cfg, home)
    if cfg.preference.enabled:
        resolve_deepspeed_config(cfg.preference.train, "preference.train")
        if cfg.preference.reference != SFT_PARENT:
            model_folder(cfg, home, cfg.preference.reference)
    if snapshot_ref:
        load_snapshot(home.snapshots, snapshot_ref)
    elif cfg.data.sources:
        source_files([Path(s).expanduser().resolve() for s in cfg.data.sources])


def eval_phrasings(cfg: LifecycleConfig) -> list[str]:
    """The hand-written eval items' prompts of the configured suites: phrasings the generator must not teach."""
    return hand_written_prompts([load_suite(s) for s in cfg.evals.suites])


def snapshot_stage(cfg: LifecycleConfig, home: Home, snapshot_ref: str | None = None) -> Snapshot:
    """An existing snapshot by hash (prefix), or the one the configured sources make (built if new)."""
    if snapshot_ref:
        return load_snapshot(home.snapshots, snapshot_ref)
    return make_snapshot(cfg.data, cfg.snapshot, home, eval_phrasings(cfg))


def _is_registry_ref(value: str) -> bool:
    return not Path(value).expanduser().exists() and REF_PATTERN.match(value.strip()) is not None


def model_folder(cfg: LifecycleConfig, home: Home, value: str, *, progress: bool = False) -> ModelFolder:
    """A model named in the config: a local folder, a registered version (``chat-base/1``, ``chat@champion``)
    downloaded once into the home cache, or an import source (a catalog name such as ``smollm2-135m-instruct``,
    a ``.gguf`` file), converted once into the home's base models."""
    if is_import_source(value):
        return import_base(value, home.base_models, home.packages, progress=progress)
    if _is_registry_ref(value):
        return inspect_model_folder(open_registry(cfg, home).resolve(value))
    return inspect_model_folder(Path(value).expanduser().resolve())


def _base_folder(cfg: LifecycleConfig, home: Home) -> ModelFolder:
    """``base_model`` as a folder or a registered version: retraining on a new snapshot then keeps the same base."""
    assert cfg.base_model
    return model_folder(cfg, home, cfg.base_model)


def base_model_stage(
    cfg: LifecycleConfig, home: Home, snapshot: Snapshot | None, *, progress: bool = True
) -> ModelFolder:
    """The configured base model (folder or registered version), or the one bootstrapped from ``snapshot``
    (trained only if new)."""
    if cfg.base_model:
        return _base_folder(cfg, home)
    assert snapshot is not None, "bootstrapping a base model needs the snapshot it learns from"
    return bootstrap(cfg.bootstrap, snapshot, home.base_models, progress=progress)


def self_replies_stage(cfg: LifecycleConfig, home: Home, snapshot: Snapshot, base: ModelFolder) -> Snapshot:
    """The snapshot the fine-tune trains on: with ``finetune.self_replies.enabled`` the one derived from
    ``snapshot`` with the base model's own replies (generated once on the eval engine's vLLM settings, then
    found), else ``snapshot`` itself."""
    spec = cfg.finetune.self_replies
    if not spec.enabled:
        return snapshot

    target = ModelTarget(label=f"base {base.path.name}", model_id=base.identity, folder=base.path)
    return derive_snapshot(
        snapshot,
        spec,
        base_hash=base.identity,
        dtype=cfg.evals.engine.dtype,
        root=home.snapshots,
        open_chat=lambda: chat_model(cfg.evals, target),
    )


def _base_identity(base: ModelFolder) -> dict[str, str]:
    """Weights and tokenizer hashes of a base model, from its manifest or computed for an external folder."""
    tokenizer = (
        {k: str(base.manifest[k]) for k in ("tokenizer_hash", "chat_template_hash")}
        if base.manifest.get("tokenizer_hash")
        else tokenizer_hashes(base.path)
    )
    return {"weights_hash": base.identity, **tokenizer}


def register_base_stage(cfg: LifecycleConfig, home: Home, base: ModelFolder, *, flow_run_id: str) -> ModelVersion:
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
    return home.runs / train_key(cfg.finetune, snapshot, base)


def finetune_stage(cfg: LifecycleConfig, home: Home, snapshot: Snapshot, base: ModelFolder) -> TrainResult:
    """Fine-tune in its run folder (``train_run_dir``): a rerun resumes or returns the finished run."""
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
    reason = f"fine-tuned ({result.method}) on snapshot {snapshot.short}; awaiting the eval gate"
    return register_result(cfg, home, lineage, result, snapshot, ds, reason=reason)


def register_result(
    cfg: LifecycleConfig,
    home: Home,
    lineage: Lineage,
    result: TrainResult,
    data: Snapshot,
    ds: dict[str, object],
    *,
    reason: str,
) -> ModelVersion:
    """Log a training run (SFT or preference) with its config, curves and artifacts, register its version with
    ``lineage`` and point ``candidate`` at it."""
    reg = open_registry(cfg, home)
    run_dir = result.run_dir
    (run_dir / "config.yaml").write_text(dump_yaml(cfg), encoding="utf-8")
    (run_dir / "deepspeed.json").write_text(json.dumps(ds, indent=2) + "\n", encoding="utf-8")
    summary = {
        f"metrics.{k}": f"{v:.4f}" for k, v in result.metrics.items() if k.startswith("val_") and isinstance(v, float)
    }
    summary |= {
        "metrics.tokens_per_s": f"{result.metrics['tokens_per_s']:.0f}",
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
            "snapshot": data.path / "manifest.json",
            "training": run_dir / "train_result.json",
            "logs": run_dir / "logs",
        },
        summary=summary,
    )
    reg.set_alias(version.name, CANDIDATE, version.version, actor=f"flow-run:{lineage.flow_run_id}", reason=reason)
    return reg.get(version.name, version.version)
