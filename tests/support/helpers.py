"""Small helpers shared by tests (``support.helpers``: importable because pyproject puts tests/ on the path)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ENGINE_DTYPE_ENV = "LIFECYCLE_TEST_ENGINE_DTYPE"


def engine_overrides() -> list[str]:
    """``--set`` overrides forcing the engines' dtype (pytest --engine-dtype, see tests/conftest.py), or none."""
    dtype = os.environ.get(ENGINE_DTYPE_ENV)
    if not dtype:
        return []
    if dtype not in ("bfloat16", "float32"):
        raise ValueError(f"{ENGINE_DTYPE_ENV}={dtype!r}: use bfloat16 or float32")
    return [f"serving.engine.dtype={dtype}", f"evals.engine.dtype={dtype}"]


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    """Write rows as JSONL; a str row is written verbatim (for malformed-line tests)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return path


def chat(user: str, assistant: str, system: str | None = None, **metadata: Any) -> dict[str, Any]:
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": user},
        {"role": "assistant", "content": assistant},
    ]
    return {"messages": messages, **({"metadata": metadata} if metadata else {})}


def finetune_in_subprocess(
    cfg_json: str, snapshot_root: str, snapshot_hash: str, base: str, run_dir: str, dpo: str | None = None
) -> None:
    """Entry point for tests that kill a fine-tune mid-way:
    ``python -c "from support import helpers; helpers...(...)"``;
    ``dpo``: the preference stage's objective as JSON (``DpoSpec.job()``: loss, beta, sft_weight, reference_model)."""
    from pathlib import Path

    from core import runtime
    from core.home import Home
    from training.config import FinetuneConfig
    from training.data.snapshot import load_snapshot
    from training.finetune.launch import DpoSpec, finetune
    from training.model.modelio import inspect_model_folder

    runtime.configure(Home.resolve())
    spec = None
    if dpo is not None:
        d = json.loads(dpo)
        spec = DpoSpec(d["beta"], d["sft_weight"], inspect_model_folder(Path(d["reference_model"])), d["loss"])
    finetune(
        FinetuneConfig.model_validate_json(cfg_json),
        load_snapshot(Path(snapshot_root), snapshot_hash),
        inspect_model_folder(Path(base)),
        Path(run_dir),
        spec,
    )


def train_version(cfg: Any, home: Any, run_id: str = "test") -> Any:
    """The train flow's stages without Prefect (snapshot, base model, fine-tune, register): a registered version."""
    from flows import stages

    snap = stages.snapshot_stage(cfg, home)
    base = stages.base_model_stage(cfg, home, snap, progress=False)
    base_version = stages.register_base_stage(cfg, home, base, flow_run_id=run_id)
    result = stages.finetune_stage(cfg, home, snap, base)
    return stages.register_stage(cfg, home, snap, base, base_version, result, flow_run_id=run_id)


def lora_adapter(base: Path, out: Path, seed: int, rank: int = 8) -> Path:
    """A LoRA adapter with random (non-zero) weights on ``base``: a servable version that answers differently
    from its base, made in a second instead of a fine-tune."""
    import shutil

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    cfg = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(model, cfg).save_pretrained(str(out))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (base / name).is_file():
            shutil.copy(base / name, out / name)
    return out


def register_serving_versions(cfg: Any, home: Any, base: Path, work: Path) -> dict[str, Any]:
    """Registered versions for gateway tests, without training: chat-base/1 (the base), chat/1 and chat/2 (LoRA
    adapters on it: champion and challenger), chat/3 (a full copy of the base: previous-champion, the fallback,
    on an engine of its own), chat/4 (another adapter, no alias: returned as ``slow``; the gateway fixture slows
    its answers with ``serving.faults`` so that a request on it cannot finish before its client leaves)."""
    from flows.stages import open_registry
    from registry.lineage import register_base_model

    reg = open_registry(cfg, home)
    manifest = json.loads((base / "lifecycle.json").read_text())
    base_version = register_base_model(reg, folder=base, manifest=manifest, curve=[], git_sha="test", flow_run_id="t")
    versions: dict[str, Any] = {}
    for alias, source, seed in (
        ("champion", "lora", 1),
        ("challenger", "lora", 2),
        ("previous-champion", "full", 0),
        ("slow", "lora", 4),
    ):
        folder = lora_adapter(base, work / f"adapter-{seed}", seed) if source == "lora" else base
        tags = {
            "lineage.base_model": base_version.ref,
            "lineage.weights_hash": f"{source}-{seed}-{manifest['weights_hash']}"
            if source == "lora"
            else manifest["weights_hash"],
            "lineage.method": source,
        }
        run_id = reg.log_run(
            run_name=f"serving-test-{alias}",
            params={},
            metrics=[],
            artifacts={"model": folder},
            tags={"lifecycle.stage": "test"},
        )
        mv = reg.register(reg.cfg.model_name, run_id, "model", tags)
        if alias != "slow":
            reg.set_alias(mv.name, alias, mv.version, reason="serving test fixture", actor="tests")
        versions[alias] = mv
    return versions


def killed_after_first_checkpoint(call: str, run_dir: Path) -> None:
    """Run ``helpers.<call>`` (a fine-tune) in a subprocess, paused once it committed its first checkpoint
    (``training.finetune.faults``), and SIGKILL its whole process group there, as a crash or an OOM kill would; the
    ranks, in sessions of their own, die with their launcher."""
    import signal
    import subprocess
    import sys
    import time

    from support.cli_helpers import paused_after_first_checkpoint

    repo = Path(__file__).resolve().parents[2]
    # the caller's path kept after ours: packages installed beside the interpreter's (a GPU machine's carried wheels)
    path = os.pathsep.join(filter(None, [str(repo / "tests"), str(repo), os.environ.get("PYTHONPATH")]))
    env = paused_after_first_checkpoint({**os.environ, "PYTHONPATH": path})
    proc = subprocess.Popen(
        [sys.executable, "-c", f"from support import helpers; helpers.{call}"],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    paused = run_dir / "paused.rank0"  # rank 0 committed its first checkpoint and waits there (the fault)
    try:
        while not paused.is_file():
            assert proc.poll() is None, "the run ended without pausing after its first checkpoint (the fault)"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (run_dir / "train_result.json").exists()  # it really died mid-way


def assert_stores_nul_text(store: Any) -> None:
    """A ``serving.state.store.ServingStore`` (SQLite or PostgreSQL) stores text holding NUL characters, which a model's
    reply or a client's input may contain, with U+FFFD in their place (PostgreSQL's text cannot hold NUL)."""
    from datetime import UTC, datetime

    from serving.state.store import RequestLogEntry

    key, _ = store.create_key("nul-text")
    conv = store.create_conversation(key.id, "chat\x00", system="be\x00brief")
    store.append_messages(key.id, conv.id, [{"role": "user", "content": "a\x00b"}], None)
    entry = RequestLogEntry(
        request_id="req_nul",
        at=datetime.now(UTC),
        key_id=key.id,
        model="chat\x00",
        status="ok",
        http_status=200,
        prompt_text="p\x00",
        response_text="r\x00",
        error="e\x00",
    )
    store.log_request(entry)
    got = store.get_conversation(key.id, conv.id)
    assert (got.model, got.system, got.messages[0]["content"]) == ("chat\ufffd", "be\ufffdbrief", "a\ufffdb")
    (row,) = [r for r in store.request_log() if r.request_id == "req_nul"]
    assert (row.model, row.prompt_text, row.response_text, row.error) == ("chat\ufffd", "p\ufffd", "r\ufffd", "e\ufffd")


def assert_erases_log_texts(store: Any) -> None:
    """A ``ServingStore`` (SQLite or PostgreSQL): deleting a conversation erases its texts from the request log,
    its feedback and the shadow log at once, and only its own; the retention pass erases the texts of rows older
    than the period; the numbers (usage, cost, tokens, ratings, shadow comparisons) stay."""
    from dataclasses import replace
    from datetime import UTC, datetime, timedelta

    from serving.state.store import RequestLogEntry, ShadowLogEntry

    now = datetime.now(UTC)
    key, _ = store.create_key("erasure")
    gone, kept = (store.create_conversation(key.id, "chat") for _ in range(2))
    row = RequestLogEntry(
        request_id="req_gone",
        at=now,
        key_id=key.id,
        model="chat",
        model_version="chat/1",
        status="ok",
        http_status=200,
        prompt_tokens=7,
        completion_tokens=5,
        conversation_id=gone.id,
        prompt_text="my secret plan",
        response_text="a reply quoting it",
        error="an error quoting it",
        cost_usd=0.25,
    )
    store.log_answer(row)
    store.log_answer(replace(row, request_id="req_kept", conversation_id=kept.id))
    store.log_answer(replace(row, request_id="req_old", conversation_id=None, at=now - timedelta(days=40)))
    store.record_feedback(key.id, "req_gone", -1, "a better answer", "a comment")
    shadow = ShadowLogEntry(
        request_id="req_gone",
        at=now,
        primary_version="chat/1",
        shadow_version="chat/2",
        status="error",
        error="it said: my secret plan",
    )
    store.log_shadow(shadow)
    store.log_shadow(replace(shadow, request_id="req_kept"))

    store.delete_conversation(key.id, gone.id)
    by_id = {r.request_id: r for r in store.request_log()}
    texts = ("prompt_text", "response_text", "error", "feedback_better", "feedback_comment")
    assert [getattr(by_id["req_gone"], t) for t in texts] == [None] * 5
    assert (by_id["req_gone"].completion_tokens, by_id["req_gone"].cost_usd, by_id["req_gone"].feedback_rating) == (
        5,
        0.25,
        -1,
    )
    assert by_id["req_kept"].prompt_text == "my secret plan"
    assert {s.request_id: s.error for s in store.shadow_log()} == {"req_gone": None, "req_kept": shadow.error}
    (usage,) = store.usage(key.id, start=now.date())
    assert (usage.requests, usage.completion_tokens, usage.cost_usd) == (2, 10, 0.5)  # billing is untouched

    assert store.erase_old_log_texts(timedelta(days=30)) == (1, 0)
    assert store.erase_old_log_texts(timedelta(days=30)) == (0, 0)  # idempotent
    by_id = {r.request_id: r for r in store.request_log()}
    assert (by_id["req_old"].prompt_text, by_id["req_old"].completion_tokens) == (None, 5)
    assert by_id["req_kept"].prompt_text == "my secret plan"  # inside the period
    assert store.erase_old_log_texts(timedelta(0), now=now + timedelta(seconds=1)) == (1, 1)
    assert all(r.prompt_text is None for r in store.request_log()) and len(store.request_log()) == 3
    assert [s.error for s in store.shadow_log()] == [None, None]
