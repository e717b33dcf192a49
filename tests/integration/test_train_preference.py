"""The preference stage with the real engines on the tiny config: SFT then DPO on 2 gloo ranks (DeepSpeed, ZeRO-1),
the export check, the aligned version registered with its lineage in MLflow, and a DPO run killed after its first
checkpoint resuming to the same weights.

Its home shares the session home's base models and run folders (the SFT run test_train.py trains is found, not
trained again) but has its own registry, so the versions this module registers do not move the session's aliases.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support.helpers import engine_overrides, killed_after_first_checkpoint
from transformers import AutoModelForCausalLM, AutoTokenizer

from core.home import Home
from flows.config import CONFIG_DIR, LifecycleConfig, load_config
from registry.lineage import LINEAGE_TAGS, PREFERENCE_TAGS
from training.config import FinetuneConfig
from training.data.snapshot import load_snapshot
from training.finetune.dpo import REFERENCE_LOGPS, encode_pairs, pair_logps
from training.finetune.launch import DpoSpec, finetune
from training.model.modelio import inspect_model_folder, tensors_hash


@pytest.fixture(scope="module")
def cfg() -> LifecycleConfig:
    # plain DPO (the default adds an NLL term on the chosen replies, hand-checked in
    # tests/unit/training/finetune/test_dpo.py): its loss at step 0 is exactly log 2
    return load_config(
        CONFIG_DIR / "tiny.yaml", [*engine_overrides(), "preference.enabled=true", "preference.sft_weight=0"]
    )


@pytest.fixture(scope="module")
def home(session_home: Home, tmp_path_factory: pytest.TempPathFactory) -> Home:
    home = Home(tmp_path_factory.mktemp("preference-home"))
    for shared in (session_home.runs, session_home.base_models):
        shared.mkdir(parents=True, exist_ok=True)
        target = home.root / shared.relative_to(session_home.root)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(shared, target_is_directory=True)
    return home


@pytest.fixture(scope="module")
def trained(cfg: LifecycleConfig, home: Home, prefect_harness: None):  # type: ignore[no-untyped-def]
    from flows.train import train_flow

    return train_flow(cfg, home)


@pytest.fixture(scope="module")
def registry(cfg: LifecycleConfig, home: Home):  # type: ignore[no-untyped-def]
    from flows.stages import open_registry

    return open_registry(cfg, home)


def test_the_aligned_version_is_registered_with_its_sft_parent_pairs_and_reference(trained, registry, home) -> None:  # type: ignore[no-untyped-def]
    aligned = registry.get(trained.model, trained.version)
    parent = registry.parse(trained.sft_parent)
    for tag in LINEAGE_TAGS + PREFERENCE_TAGS:
        assert aligned.tags.get(tag), f"missing {tag}"
    lineage = aligned.lineage
    assert (lineage["objective"], lineage["method"]) == ("dpo", "full")
    assert lineage["sft_parent"] == parent.ref == "chat/1" and aligned.version == "2"
    assert lineage["reference_model"] == parent.ref  # preference.reference: sft_parent
    # the reference is the SFT version as a full model (tiny.yaml's SFT is LoRA: merged into its base)
    merged = inspect_model_folder(home.cache / "merged" / parent.lineage["weights_hash"][:16])
    assert lineage["reference_weights_hash"] == merged.identity
    assert lineage["snapshot"] == parent.lineage["snapshot"]  # gated on its parent's eval sets
    assert lineage["base_model"] == parent.lineage["base_model"]
    pairs = load_snapshot(home.preference_snapshots, lineage["preference_snapshot"])
    assert pairs.manifest["kind"] == "preference" and pairs.manifest["provenance"]["feedback"]["used"] is False
    assert pairs.manifest["provenance"]["chat_snapshot"] == parent.lineage["snapshot"]
    assert "lineage.objective" not in parent.tags or parent.lineage["objective"] == "sft"
    assert "lineage.sft_parent" not in parent.tags
    # the aligned version is the candidate; its SFT parent no longer
    assert "candidate" in aligned.aliases and "candidate" not in parent.aliases
    assert aligned.tags["alias.candidate.reason"].startswith("preference-tuned (dpo) from chat/1 on pairs")
    run = registry.client.get_run(aligned.run_id)
    assert run.data.tags["lifecycle.stage"] == "preference"
    assert run.data.params["preference.beta"] == "0.1"


def test_the_export_is_checked_and_dpo_moved_the_weights_toward_the_chosen_replies(trained, registry, home) -> None:  # type: ignore[no-untyped-def]
    aligned = registry.get(trained.model, trained.version)
    folder = registry.resolve(aligned.ref)
    assert tensors_hash(load_file(folder / "model.safetensors")) == aligned.lineage["weights_hash"]
    m = trained.metrics
    assert float(aligned.tags["check.max_abs_logit_diff"]) <= 1e-4
    # at step 0 the policy is its reference: the DPO loss is log 2 and no pair is ranked either way
    assert m["val_loss_initial"] == pytest.approx(0.6931, abs=1e-3)
    # training moved the policy toward the chosen replies of its pairs: its log-ratio margin over the reference,
    # averaged over every training pair (the DPO objective itself), is positive. The held-out pairs and single
    # batches may go either way after 8 tiny steps (mirrored pairs are won only by telling unseen subjects
    # apart, which the default config's gate measures: docs/loop.md, "Preference stage")
    run_dir = home.runs / aligned.lineage["train_key"]
    pairs = load_snapshot(home.preference_snapshots, aligned.lineage["preference_snapshot"])
    job = json.loads((run_dir / "job.json").read_text())
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    encoded = encode_pairs(pairs.records("train"), tok, job["config"]["max_seq_len"]).pairs
    ref = torch.load(run_dir / REFERENCE_LOGPS)[: len(encoded)]
    policy = pair_logps(model, encoded, pad_id=tok.pad_token_id, batch_size=8, device=torch.device("cpu"))
    margin = ((policy[:, 0] - ref[:, 0]) - (policy[:, 1] - ref[:, 1])).mean().item()
    assert margin > 0, margin
    assert trained.sft_metrics is not None and trained.seconds["preference"] > 0


@pytest.mark.slow  # a killed DPO run and its resume (~40 s); the newcomer's loop kills and resumes a fine-tune in CI
def test_a_killed_dpo_run_resumes_to_the_same_weights(trained, registry, home, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    aligned = registry.get(trained.model, trained.version)
    job = json.loads((home.runs / aligned.lineage["train_key"] / "job.json").read_text())  # the flow's DPO run
    pairs = load_snapshot(home.preference_snapshots, aligned.lineage["preference_snapshot"])
    objective = job["objective"]  # the flow's own settings (configs/default.yaml's, which tiny.yaml extends)
    dpo = json.dumps(objective)
    ft_json = json.dumps(job["config"])
    run_dir = tmp_path / "killed"
    killed_after_first_checkpoint(
        f"finetune_in_subprocess({ft_json!r}, {str(pairs.path.parent)!r}, {pairs.hash!r}, "
        f"{job['base_model']!r}, {str(run_dir)!r}, {dpo!r})",
        run_dir,
    )
    start = inspect_model_folder(Path(job["base_model"]))
    spec = DpoSpec(
        objective["beta"],
        objective["sft_weight"],
        inspect_model_folder(Path(objective["reference_model"])),
        objective["loss"],
    )
    resumed = finetune(FinetuneConfig.model_validate(job["config"]), pairs, start, run_dir, spec)
    assert resumed.report.resumed_from_step == 4 and resumed.report.objective == "dpo"
    assert resumed.equivalence["passed"]
    assert resumed.weights_hash == aligned.lineage["weights_hash"]


# slow: three tiny models through every suite (~3 min); the default run holds the references' mechanism in the
# e2e newcomer test (base_model), and this module's lineage test the sft_parent tag it follows
@pytest.mark.slow
def test_the_gate_report_shows_the_aligned_version_against_its_sft_parent_on_the_same_items(  # type: ignore[no-untyped-def]
    trained, cfg, home
) -> None:
    from flows.gating import gate_stage

    outcome = gate_stage(cfg, home, f"{trained.model}/{trained.version}", actor="test")
    refs = {r.tag: r for r in outcome.references}
    assert set(refs) == {"base_model", "sft_parent"} and refs["sft_parent"].ref == trained.sft_parent
    parent = refs["sft_parent"]
    assert parent.report.eval_sets == outcome.report.eval_sets  # the same held-out items
    rows = {row.metric: row for row in parent.rows}
    assert rows["over_refusal/compliance_rate"].n_paired == len(
        outcome.report.metrics()["over_refusal/compliance_rate"].items
    )
    assert f"## Against sft_parent {trained.sft_parent}" in outcome.markdown
    gate_json = json.loads(outcome.files["decision"].read_text())
    assert [r["tag"] for r in gate_json["references"]] == ["base_model", "sft_parent"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("preference.reference={missing}", "model folder not found"),
        ("preference.train.deepspeed_config=infra/deepspeed/nope.json", "preference.train.deepspeed_config"),
        ("preference.train.method=lora", "preference.train.method must be full"),
    ],
)
def test_bad_preference_inputs_end_with_one_line_before_anything_trains(
    override: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flows import cli

    home = tmp_path / "home"
    item = override.format(missing=tmp_path / "missing")
    args = ["train", "--config", str(CONFIG_DIR / "tiny.yaml"), "--home", str(home)]
    rc = cli.main([*args, "--set", "preference.enabled=true", "--set", item])
    err = capsys.readouterr().err
    assert rc in (1, 2) and message in err and err.count("\n") == 1
    assert not (home / "snapshots").exists()  # stopped before the first stage
