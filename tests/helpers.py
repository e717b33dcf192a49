"""Small helpers shared by tests (importable because pyproject puts tests/ on the path)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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


def finetune_in_subprocess(cfg_json: str, snapshot_root: str, snapshot_hash: str, base: str, run_dir: str) -> None:
    """Entry point for tests that kill a fine-tune mid-way: ``python -c "import helpers; helpers...(...)"``."""
    from pathlib import Path

    from core import runtime
    from core.home import Home
    from training.config import FinetuneConfig
    from training.finetune import finetune
    from training.modelio import inspect_model_folder
    from training.snapshot import load_snapshot

    runtime.configure(Home.resolve())
    finetune(
        FinetuneConfig.model_validate_json(cfg_json),
        load_snapshot(Path(snapshot_root), snapshot_hash),
        inspect_model_folder(Path(base)),
        Path(run_dir),
    )


def train_version(cfg: Any, home: Any, run_id: str = "test") -> Any:
    """The train flow's stages without Prefect (snapshot, base model, fine-tune, register): a registered version."""
    from flows import stages

    snap = stages.snapshot_stage(cfg, home)
    base = stages.base_model_stage(cfg, home, snap, progress=False)
    base_version = stages.register_base_stage(cfg, home, base, flow_run_id=run_id)
    result = stages.finetune_stage(cfg, home, snap, base)
    return stages.register_stage(cfg, home, snap, base, base_version, result, flow_run_id=run_id)
