"""What a quantized model folder needs of the engine that runs it: ``compute_dtype(folder)``.

vLLM 0.32's CPU kernels for compressed-tensors checkpoints (int8 W8A8, 4-bit W4A16: ``training.model.quantize``)
take bfloat16 activations only, so serving and the eval engine run such a folder in bf16 whatever the configured
dtype; any other folder gets the configured one (``None`` here).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final, Literal

QUANTIZED_DTYPE: Final = "bfloat16"


def compute_dtype(folder: Path) -> Literal["bfloat16"] | None:
    """``bfloat16`` for a compressed-tensors checkpoint, ``None`` (use the configured dtype) otherwise."""
    config = folder / "config.json"
    if not config.is_file():
        return None
    quant = json.loads(config.read_text(encoding="utf-8")).get("quantization_config") or {}
    return QUANTIZED_DTYPE if quant.get("quant_method") == "compressed-tensors" else None
