from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from training.model.modelio import ModelFolder


def _sharded(folder: Path, second: float) -> ModelFolder:
    folder.mkdir(parents=True, exist_ok=True)
    save_file({"a": torch.zeros(3)}, str(folder / "model-00001-of-00002.safetensors"))
    save_file({"b": torch.full((3,), second)}, str(folder / "model-00002-of-00002.safetensors"))
    return ModelFolder(folder, {})


def test_external_identity_covers_every_shard(tmp_path: Path) -> None:
    one, same, other = _sharded(tmp_path / "x", 1.0), _sharded(tmp_path / "y", 1.0), _sharded(tmp_path / "z", 2.0)
    assert one.identity == same.identity  # content, not location
    assert one.identity != other.identity  # a change in the second shard changes it


def test_our_recorded_hash_wins(tmp_path: Path) -> None:
    folder = _sharded(tmp_path / "x", 1.0)
    assert ModelFolder(folder.path, {"weights_hash": "abc"}).identity == "abc"
