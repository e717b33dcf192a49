"""The bootstrapped base model is a normal Hugging Face folder that learned its corpus, deterministically."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from core.home import Home
from flows.config import CONFIG_DIR, load_config
from training.model.bootstrap import bootstrap
from training.model.modelio import inspect_model_folder, weights_hash


def test_folder_has_everything_and_records_its_identity(tiny_base_model) -> None:  # type: ignore[no-untyped-def]
    path: Path = tiny_base_model.path
    for name in (
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "lifecycle.json",
        "loss_curve.json",
    ):
        assert (path / name).is_file(), name
    man = tiny_base_model.manifest
    assert len(man["weights_hash"]) == 64 and len(man["tokenizer_hash"]) == 64
    assert len(man["chat_template_hash"]) == 64 and len(man["snapshot"]) == 64
    curve = json.loads((path / "loss_curve.json").read_text())
    assert len(curve["train"]) == 150 and curve["validation"][0]["step"] == 0


def test_loss_falls_well_below_the_unigram_floor(tiny_base_model) -> None:  # type: ignore[no-untyped-def]
    m = tiny_base_model.manifest["metrics"]
    assert m["initial_loss"] > m["uniform_entropy"] - 0.5  # starts near chance
    assert m["final_loss"] < m["unigram_entropy"] - 0.5  # uses context: beats any context-free model
    assert m["final_val_loss"] < m["unigram_entropy"] - 0.5  # and generalizes to held-out text


def test_transformers_loads_it_and_generates(tiny_base_model) -> None:  # type: ignore[no-untyped-def]
    path = str(tiny_base_model.path)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert weights_hash(model) == tiny_base_model.manifest["weights_hash"]
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    out = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert out.shape[1] > ids.shape[1]
    assert torch.equal(out[0, : ids.shape[1]], ids[0])


def test_same_seed_same_weights_and_existing_models_are_reused(tiny_snapshot, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cfg = load_config(CONFIG_DIR / "tiny.yaml", ["bootstrap.pretrain.steps=20"]).bootstrap
    a = bootstrap(cfg, tiny_snapshot, tmp_path / "a", progress=False)
    b = bootstrap(cfg, tiny_snapshot, tmp_path / "b", progress=False)
    assert a.manifest["weights_hash"] == b.manifest["weights_hash"]
    assert a.manifest["tokenizer_hash"] == b.manifest["tokenizer_hash"]
    again = bootstrap(cfg, tiny_snapshot, tmp_path / "a", progress=False)
    assert again.manifest["created_at"] == a.manifest["created_at"]  # found, not retrained
    other = bootstrap(cfg.model_copy(update={"seed": 7}), tiny_snapshot, tmp_path / "a", progress=False)
    assert other.path != a.path and other.manifest["weights_hash"] != a.manifest["weights_hash"]


def test_an_external_base_model_skips_the_bootstrap(tiny_base_model, session_home: Home) -> None:  # type: ignore[no-untyped-def]
    from flows.stages import base_model_stage

    cfg = load_config(CONFIG_DIR / "tiny.yaml", [f"base_model={tiny_base_model.path}"])
    assert base_model_stage(cfg, session_home, snapshot=None).path == tiny_base_model.path
    assert inspect_model_folder(tiny_base_model.path).weights_hash == tiny_base_model.manifest["weights_hash"]
