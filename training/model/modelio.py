"""Model folders: the Hugging Face layout every stage exchanges, its identity hashes and its validation.

A model folder is what ``save_pretrained`` writes (``config.json``, ``*.safetensors``, tokenizer files, chat
template) plus our ``lifecycle.json`` manifest when we made it. ``inspect_model_folder`` checks a folder
before anything spends time on it and says precisely what is missing.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from core.errors import ModelError, NotFoundError
from core.hashing import sha256_files

MANIFEST = "lifecycle.json"


@dataclass(frozen=True)
class ModelFolder:
    path: Path
    manifest: dict[str, Any]

    @property
    def weights_hash(self) -> str | None:
        """The tensor hash recorded when we made the model (None for external folders)."""
        value = self.manifest.get("weights_hash")
        return str(value) if value else None

    @cached_property
    def identity(self) -> str:
        """What identifies the weights: our recorded tensor hash, or for an external folder the SHA-256 over all
        its safetensors shards (streamed from disk, computed once per object)."""
        return self.weights_hash or sha256_files(self.path, [p.name for p in self.path.glob("*.safetensors")])


@contextmanager
def staged_folder(final: Path) -> Iterator[Path]:
    """A temporary folder beside ``final`` to write a model into; renamed to ``final`` when the block ends
    without error (a concurrent writer that got there first wins), removed otherwise: ``final`` is complete or
    absent."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        yield tmp
        try:
            tmp.rename(final)
        except OSError:
            if not (final / MANIFEST).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def tensors_hash(tensors: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over named tensors (name, dtype, shape, bytes) in name order: identical weights, identical hash."""
    h = hashlib.sha256()
    for name, tensor in sorted(tensors.items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def weights_hash(model: torch.nn.Module) -> str:
    return tensors_hash(model.state_dict())


def inspect_model_folder(path: Path) -> ModelFolder:
    """Check that ``path`` is a loadable causal-LM folder with a chat-capable tokenizer."""
    if not path.is_dir():
        raise NotFoundError(f"model folder not found: {path}")
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not any(path.glob("*.safetensors")):
        missing.append("*.safetensors weights")
    if not ((path / "tokenizer.json").is_file() or (path / "tokenizer.model").is_file()):
        missing.append("tokenizer.json")
    tok_cfg = path / "tokenizer_config.json"
    has_template = (path / "chat_template.jinja").is_file() or (
        tok_cfg.is_file() and "chat_template" in json.loads(tok_cfg.read_text(encoding="utf-8"))
    )
    if not has_template:
        missing.append("a chat template (chat_template.jinja)")
    if missing:
        raise ModelError(f"{path} is not a usable model folder: missing {', '.join(missing)}")
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ModelError(f"{path}/config.json is not valid JSON: {exc.msg}") from None
    if not any(str(a).endswith("ForCausalLM") for a in config.get("architectures") or []):
        raise ModelError(f"{path} is not a causal language model (architectures: {config.get('architectures')})")
    manifest_path = path / MANIFEST
    manifest = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.is_file() else {}
    return ModelFolder(path, manifest)


def merge_adapter(base: Path, adapter: Path, out: Path) -> Path:
    """A full model folder with a LoRA adapter merged into its base (``W + scale * B @ A``), plus the adapter's
    tokenizer and chat template; written to a temporary folder and renamed, so ``out`` is complete or absent.

    Used where an adapter cannot be served as a ``LoRARequest``: vLLM 0.32's CPU LoRA kernels crash on
    prompt logprobs (``bgmv_shrink`` in the logits processor), which lm-eval's loglikelihood tasks need."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
        merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
        merged.save_pretrained(str(tmp))
        AutoTokenizer.from_pretrained(str(adapter)).save_pretrained(str(tmp))
        GenerationConfig.from_pretrained(str(base)).save_pretrained(str(tmp))
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
