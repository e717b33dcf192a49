"""The preference stage's adapters (no Prefect here): pair snapshot, the SFT model DPO starts from, its reference,
DPO on DeepSpeed, and the aligned version's registration with its lineage.

    pairs = pair_snapshot_stage(cfg, home, chat_snapshot, feedback=False)
    job = preference_job(cfg, home, sft_version, pairs)   # the SFT version as a full model, the DPO objective
    result = preference_stage(cfg, home, job)
    version = register_preference_stage(cfg, home, job, result, flow_run_id=...)

The pair snapshot holds the generated pairs (``training/data/synth_pairs.py``) and, on a retrain (``feedback``), the
pairs curated from production feedback once there are ``preference.feedback_min_pairs`` of them. It is checked
against the eval sets of the SFT version's chat snapshot: no pair's prompt is an eval prompt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from core.hashing import sha256_json
from core.home import Home
from core.provenance import git_sha
from evals.runner import ModelTarget, chat_model
from flows.config import LifecycleConfig
from flows.gating import eval_sets_stage
from flows.stages import eval_phrasings, model_folder, open_registry, register_result
from registry.lineage import Lineage
from registry.store import ModelVersion
from training.config import SFT_PARENT
from training.data import policy_pairs
from training.data.pairs import CURATED_FOLDER
from training.data.snapshot import PAIRS, Snapshot, build_snapshot
from training.data.synth import code_hash, write_jsonl
from training.data.synth_pairs import generate_pairs
from training.finetune.launch import DpoSpec, TrainResult, finetune, resolve_deepspeed_config, train_key
from training.model.modelio import ModelFolder, inspect_model_folder, merge_adapter
from training.model.tokenizer import tokenizer_hashes


def feedback_files(home: Home) -> list[Path]:
    """The curated feedback pairs (``$LIFECYCLE_HOME/data/curated/preferences/*.jsonl``), sorted."""
    folder = home.curated / CURATED_FOLDER
    return sorted(folder.glob("*.jsonl")) if folder.is_dir() else []


def feedback_count(home: Home) -> int:
    return sum(1 for f in feedback_files(home) for line in f.read_text(encoding="utf-8").splitlines() if line.strip())


def pair_snapshot_stage(
    cfg: LifecycleConfig, home: Home, chat_snapshot: str, *, feedback: bool, sft: ModelVersion | None = None
) -> Snapshot:
    """The pair snapshot of a preference stage after SFT on ``chat_snapshot`` (built if new); the on-policy kinds
    (``training/data/policy_pairs.py``) need the SFT version ``sft`` whose replies they contrast."""
    sets = eval_sets_stage(cfg, home, chat_snapshot)
    holdout = sets.prompts()
    key = sha256_json(
        {
            "pairs": cfg.preference.data.model_dump(mode="json"),
            "generator": cfg.data.generator.config_hash(),
            "code": code_hash(),
            "eval_sets": sets.hash,
        }
    )
    generated = home.generated_data / "pairs" / key[:16] / "pairs.jsonl"
    if not generated.is_file():
        write_jsonl(generate_pairs(cfg.preference.data, cfg.data.generator, holdout), generated)
    sources = [generated]
    on_policy = None
    if policy_pairs.wanted(cfg.preference.data):
        if sft is None:
            raise ConfigError("preference.data.counts: the on-policy kinds need the SFT version they are made for")
        on_policy_file, on_policy = on_policy_pairs_stage(cfg, home, sft, sets.hash, holdout)
        sources.append(on_policy_file)
    available = feedback_count(home) if feedback else 0
    use_feedback = feedback and available >= cfg.preference.feedback_min_pairs
    if use_feedback:
        sources += feedback_files(home)
    limits = cfg.snapshot.model_copy(update={"on_invalid": cfg.preference.data.on_invalid})
    provenance = {
        "generator": {"seed": cfg.preference.data.seed, "counts": dict(cfg.preference.data.counts)},
        "eval_sets": sets.hash,
        "chat_snapshot": chat_snapshot,
        "feedback": {"available": available, "min_pairs": cfg.preference.feedback_min_pairs, "used": use_feedback},
        **({"on_policy": on_policy} if on_policy else {}),
    }
    return build_snapshot(
        limits,
        sources,
        home.preference_snapshots,
        reports=home.reports,
        provenance=provenance,
        kind=PAIRS,
        holdout=holdout,
    )


def on_policy_pairs_stage(
    cfg: LifecycleConfig, home: Home, sft: ModelVersion, eval_sets: str, holdout: set[str]
) -> tuple[Path, dict[str, Any]]:
    """The on-policy pairs of ``sft`` (its replies and its base model's, generated once on the eval engine's vLLM
    settings, then found by their key) and their summary."""
    data = cfg.preference.data
    policy = sft_start_stage(cfg, home, sft)
    base = model_folder(cfg, home, sft.lineage["base_model"])
    avoid = eval_phrasings(cfg)
    key = sha256_json(
        {
            "counts": policy_pairs.wanted(data),
            "seed": data.seed,
            "max_tokens": data.max_tokens,
            "cut_replies": data.cut_replies,
            "dtype": cfg.evals.engine.dtype,
            "policy": policy.identity,
            "base": base.identity,
            "code": sha256_json([code_hash(), policy_pairs.code_hash()]),
            "avoid": sha256_json(avoid),
            "eval_sets": eval_sets,
        }
    )
    folder = home.generated_data / "pairs" / f"on-policy-{key[:16]}"
    if not (folder / "summary.json").is_file():
        drawn = policy_pairs.draw(data, avoid=avoid, exclude=holdout)

        def engine(model: ModelFolder, label: str) -> policy_pairs.OpenChat:
            return lambda: chat_model(cfg.evals, ModelTarget(label=label, model_id=model.identity, folder=model.path))

        pairs, summary = policy_pairs.contrast_pairs(
            drawn, policy=engine(policy, sft.ref), base=engine(base, sft.lineage["base_model"]), cfg=data
        )
        summary = {"policy": sft.ref, "base": sft.lineage["base_model"], "key": key, **summary}
        write_jsonl(pairs, folder / "pairs.jsonl")
        tmp = folder / "summary.json.tmp"  # written last: its presence says the pairs are complete
        tmp.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        tmp.replace(folder / "summary.json")
    return folder / "pairs.jsonl", json.loads((folder / "summary.json").read_text(encoding="utf-8"))


def sft_start_stage(cfg: LifecycleConfig, home: Home, sft: ModelVersion) -> ModelFolder:
    """The SFT version as a full model folder: its export, or for a LoRA adapter the adapter merged into its base
    (the folder the gate evaluates too, ``flows.gating``)."""
    reg = open_registry(cfg, home)
    folder = reg.resolve(sft.ref)
    if (folder / "adapter_config.json").is_file():
        base = reg.resolve(sft.lineage["base_model"])
        folder = merge_adapter(base, folder, home.cache / "merged" / sft.lineage["weights_hash"][:16])
    return inspect_model_folder(folder)


@dataclass(frozen=True)
class PreferenceJob:
    """One preference stage: the SFT version it tunes, its pair snapshot, the full model it starts from, and the
    DPO objective (beta, NLL weight, frozen reference)."""

    sft: ModelVersion
    pairs: Snapshot
    start: ModelFolder
    spec: DpoSpec

    def key(self, cfg: LifecycleConfig) -> str:
        return train_key(cfg.preference.train, self.pairs, self.start, self.spec)

    def run_dir(self, cfg: LifecycleConfig, home: Home) -> Path:
        return home.runs / self.key(cfg)


def preference_job(cfg: LifecycleConfig, home: Home, sft: ModelVersion, pairs: Snapshot) -> PreferenceJob:
    """The SFT version as the starting point (``sft_start_stage``) and the configured reference."""
    start = sft_start_stage(cfg, home, sft)
    p = cfg.preference
    reference = start if p.reference == SFT_PARENT else model_folder(cfg, home, p.reference)
    return PreferenceJob(
        sft, pairs, start, DpoSpec(beta=p.beta, sft_weight=p.sft_weight, reference=reference, loss=p.loss)
    )


def preference_stage(cfg: LifecycleConfig, home: Home, job: PreferenceJob) -> TrainResult:
    """DPO in its run folder (a rerun resumes or returns the finished run)."""
    return finetune(cfg.preference.train, job.pairs, job.start, job.run_dir(cfg, home), job.spec)


def register_preference_stage(
    cfg: LifecycleConfig, home: Home, job: PreferenceJob, result: TrainResult, *, flow_run_id: str
) -> ModelVersion:
    """Register the aligned version (lineage: its SFT parent, pair snapshot and reference model) and move
    ``candidate`` to it."""
    reg = open_registry(cfg, home)
    key = job.key(cfg)
    existing = reg.find(cfg.registry.model_name, lineage_train_key=key)
    if existing:
        return existing[0]
    ds_path, ds = resolve_deepspeed_config(cfg.preference.train, "preference.train")
    sft, pairs = job.sft, job.pairs
    parent = sft.lineage
    lineage = Lineage(
        snapshot=parent["snapshot"],
        base_model=parent["base_model"],
        base_weights_hash=parent["base_weights_hash"],
        config_hash=cfg.preference.config_hash(),
        deepspeed_config=ds_path.name,
        deepspeed_config_hash=sha256_json(ds),
        seed=cfg.preference.train.seed,
        git_sha=git_sha(),
        **tokenizer_hashes(result.export_dir),
        weights_hash=result.weights_hash,
        flow_run_id=flow_run_id,
        method=result.method,
        train_key=key,
        objective="dpo",
        sft_parent=sft.ref,
        preference_snapshot=pairs.hash,
        reference_model=sft.ref if cfg.preference.reference == SFT_PARENT else cfg.preference.reference,
        reference_weights_hash=job.spec.reference.identity,
    )
    reason = f"preference-tuned (dpo) from {sft.ref} on pairs {pairs.short}; awaiting the eval gate"
    return register_result(cfg, home, lineage, result, pairs, ds, reason=reason)
