"""Quantized variants of a model folder: ``quantize(parent, out, cfg) -> ModelFolder``, a compressed-tensors
checkpoint that vLLM's CPU backend serves.

The scheme is calibration-free round-to-nearest, written with compressed-tensors' own API (the quantization config
applied to the model, the scales computed from the weights, ``ModelCompressor`` packing them and writing the
``quantization_config`` vLLM reads), so no hand-written format:

- ``W8A8`` (the default): int8 weights, symmetric per output channel, and int8 activations quantized per token at
  run time (dynamic), so no calibration data. vLLM 0.32's CPU path runs it through ``CPUInt8ScaledMMLinearKernel``
  (oneDNN int8 GEMM: AVX512-VNNI/AMX on the Xeons this runs on).
- ``W4A16``: 4-bit weights in groups (``group_size``; SmolLM2's 576-wide layers take 64, not the preset's 128),
  activations unquantized, run by the CPU's ``CPUWNA16`` kernels. Without GPTQ/AWQ calibration (llm-compressor
  is not in the environment) 4-bit round-to-nearest loses more than int8.

Both CPU kernels compute in bfloat16 only (fp32 activations are refused: ``int8_scaled_mm_with_quant: expect A to
be bfloat16 or half``, ``cpu_gemm_wna16 not implemented for 'Float'``), so a quantized folder is served and
evaluated in bf16 whatever ``serving.engine.dtype`` says (``core.quantized.compute_dtype``). The embeddings and
``lm_head`` (tied in SmolLM2) stay in full precision.

The folder is written once per (parent weights, scheme, ``QUANTIZER``) key, complete or absent
(``modelio.staged_folder``), with the parent's tokenizer and template and a ``lifecycle.json`` naming the parent.

    lifecycle quantize chat 3                  # register chat/N+1, lineage.parent=chat/3, lineage.method=W8A8
"""

from __future__ import annotations

import json
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from core.errors import ModelError
from core.hashing import sha256_files, sha256_json
from training.config import QuantizeConfig
from training.model.modelio import MANIFEST, ModelFolder, inspect_model_folder, staged_folder

# bump when what a quantization writes changes: the key of every quantized folder includes it
QUANTIZER = "ct-rtn/1"
# the tokenizer and generation files a quantized folder takes from its parent unchanged
_COPIED = (
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)


def quantized_key(parent: ModelFolder, cfg: QuantizeConfig) -> str:
    return sha256_json({"parent": parent.identity, "method": cfg.method(), "ignore": cfg.ignore, "q": QUANTIZER})[:16]


def quantize(parent: ModelFolder, root: Path, cfg: QuantizeConfig) -> ModelFolder:
    """``<root>/quantized-<key>``: ``parent`` quantized by ``cfg`` (made once; a second call returns it)."""
    final = root / f"quantized-{quantized_key(parent, cfg)}"
    if (final / MANIFEST).is_file():
        return inspect_model_folder(final)
    with staged_folder(final) as tmp:
        started = time.perf_counter()
        stats = _write_quantized(parent.path, tmp, cfg)
        for name in _COPIED:
            if (parent.path / name).is_file():
                shutil.copy2(parent.path / name, tmp / name)
        weights = sha256_files(tmp, sorted(p.name for p in tmp.glob("*.safetensors")))
        manifest: dict[str, Any] = {
            **{
                k: parent.manifest[k]
                for k in ("tokenizer_hash", "chat_template_hash", "eos_token")
                if k in parent.manifest
            },
            "kind": "quantized",
            "key": final.name,
            "weights_hash": weights,
            "parent_weights_hash": parent.identity,
            "method": cfg.method(),
            "quantization": {**cfg.model_dump(exclude={"enabled"}), "quantizer": QUANTIZER},
            "metrics": stats,
            "duration_s": round(time.perf_counter() - started, 1),
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return inspect_model_folder(final)


def _write_quantized(src: Path, out: Path, cfg: QuantizeConfig) -> dict[str, Any]:
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config, preset_name_to_scheme
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    if getattr(model.config, "quantization_config", None):
        raise ModelError(f"{src} is already quantized; quantize its full-precision parent")
    scheme = preset_name_to_scheme(cfg.scheme, ["Linear"])
    if cfg.scheme == "W4A16" and scheme.weights is not None:
        scheme.weights.group_size = cfg.group_size
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=cfg.ignore))
    layers, error = _set_scales(model)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(str(out))
    size = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    return {"quantized_layers": layers, "weight_rel_error": round(error, 6), "weights_bytes": size}


def _set_scales(model: torch.nn.Module) -> tuple[int, float]:
    """Round-to-nearest scales (and zero points) from each quantized layer's own weights: min/max per output
    channel or per group, as compressed-tensors computes them (``calculate_qparams``). Returns the layer count and
    the mean relative error of the fake-quantized weights (a sanity number for the manifest)."""
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import calculate_qparams, is_module_quantized

    layers, errors = 0, []
    with torch.no_grad():
        for layer in model.modules():
            module: Any = layer  # a quantized Linear: compressed-tensors adds its scheme and scale parameters
            if not is_module_quantized(module):
                continue
            args = module.quantization_scheme.weights
            w = module.weight.data
            if str(args.strategy).endswith("group"):
                if w.shape[1] % args.group_size:
                    raise ModelError(f"group size {args.group_size} does not divide a {w.shape[1]}-wide layer")
                grouped = w.reshape(w.shape[0], -1, args.group_size)
                lo, hi = grouped.amin(-1), grouped.amax(-1)
            else:
                lo, hi = w.amin(1, keepdim=True), w.amax(1, keepdim=True)
            scale, zero = calculate_qparams(lo, hi, args)
            module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
            module.weight_zero_point.data.copy_(zero.reshape(module.weight_zero_point.shape))
            q = fake_quantize(w, module.weight_scale, module.weight_zero_point, args)
            errors.append(float((q - w).norm() / w.norm()))
            layers += 1
    if not layers:
        raise ModelError("no layer was quantized (check quantize.ignore)")
    return layers, sum(errors) / len(errors)
