"""A fine-tuned MiniLM encoder as the int8 ONNX graph the gateway runs (``core.minilm_onnx``).

    model = export_int8(source, layers=6)   # bytes: BertModel's first 6 layers, the token sum, int8 MatMuls
    EncoderEmbedder(tokenizer_json, {WORD: source[WORD]}, 6, cls_sep, model, disabled_optimizers=DISABLED_OPTIMIZERS)

``source`` holds BertModel's tensors (``core.minilm.param_names``) as the classifier folder stores them (float16),
so the graph is made from exactly what training scored. The export is torch's TorchScript-based one
(``dynamo=False``: no onnxscript needed), opset 17, batch and token axes dynamic, the token ids its only input:
``core.minilm_onnx`` runs one unpadded sequence at a time, and without a mask the export has no mask arithmetic
(the same sums to the bit, 0.91 of the time a 48-token pass took with it); the quantization is ONNX
Runtime's dynamic one: MatMul weights int8 per output channel with 7-bit range (why 7: ``core.minilm_onnx``),
activations quantized per call. Needs torch, onnx and onnxruntime (training time only).
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from core.minilm import HEADS, HIDDEN, param_names
from core.minilm_onnx import INPUTS, WORD

OPSET = 17


def bert_model(source: Mapping[str, NDArray[Any]], layers: int) -> Any:
    """transformers' ``BertModel`` with MiniLM's shapes and ``layers`` layers, ``source``'s tensors loaded
    (float32), no pooler: what ``core.minilm`` computes."""
    import torch
    from transformers import BertConfig, BertModel

    bert = BertModel(
        BertConfig(
            vocab_size=source[WORD].shape[0],
            hidden_size=HIDDEN,
            num_hidden_layers=layers,
            num_attention_heads=HEADS,
            intermediate_size=source["encoder.layer.0.intermediate.dense.weight"].shape[0],
            max_position_embeddings=source["embeddings.position_embeddings.weight"].shape[0],
            type_vocab_size=source["embeddings.token_type_embeddings.weight"].shape[0],
            hidden_act="gelu",
            layer_norm_eps=1e-12,
        ),
        add_pooling_layer=False,
    )
    wanted = param_names(layers)
    loaded = bert.load_state_dict(
        {n: torch.from_numpy(np.asarray(source[n], dtype=np.float32)) for n in wanted}, strict=False
    )
    if loaded.unexpected_keys or [k for k in loaded.missing_keys if not k.endswith("position_ids")]:
        raise ValueError(f"MiniLM tensors do not fit BertModel: {loaded}")
    return bert.eval()


def export_int8(source: Mapping[str, NDArray[Any]], layers: int, quantize: bool = True) -> bytes:
    """The serialized graph: ids (batch, tokens) -> the sum of the last layer's hidden states (batch, 384), for
    unpadded sequences; its MatMuls int8 unless ``quantize`` is false (float32: for checking the export itself)."""
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic

    bert = bert_model(source, layers)

    class Summed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=ids).last_hidden_state.sum(1)

    example = torch.ones((1, 8), dtype=torch.long)
    axes = {name: {0: "batch", 1: "tokens"} for name in INPUTS}
    with tempfile.TemporaryDirectory(prefix="harm-onnx-") as tmp:
        plain, int8 = Path(tmp) / "encoder.onnx", Path(tmp) / "encoder-int8.onnx"
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer notes
            torch.onnx.export(
                Summed().eval(),
                (example,),
                str(plain),
                input_names=list(INPUTS),
                output_names=["sums"],
                dynamic_axes=axes | {"sums": {0: "batch"}},
                opset_version=OPSET,
                dynamo=False,
            )
        if not quantize:
            return plain.read_bytes()
        root = logging.getLogger()
        quiet = _DropPreprocessingHint()
        root.addFilter(quiet)  # ONNX Runtime suggests shape pre-processing, which only static quantization needs
        try:
            quantize_dynamic(
                plain,
                int8,
                weight_type=QuantType.QInt8,
                per_channel=True,
                reduce_range=True,
                op_types_to_quantize=["MatMul"],
            )
        finally:
            root.removeFilter(quiet)
        return int8.read_bytes()


class _DropPreprocessingHint(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "pre-processing before quantization" not in record.getMessage()
