"""MiniLM's layers as an ONNX Runtime session with int8 matmuls: the harm classifier's encoder on the request path.

    enc = OnnxMiniLm(model_bytes, word_table, layers=6, disabled_optimizers=DISABLED_OPTIMIZERS)
    enc.sum_many([np.array([101, 7592, 102])])           # (1, 384) float32: the sum of the hidden states

``training.onnx_encoder.export_int8`` writes the graph: ``BertModel``'s first ``layers`` layers and the token sum
(a graph exported before 2026-11-29 also takes an all-ones attention mask, which is fed to it), its MatMul
weights quantized to int8 per output channel with 7-bit range (``reduce_range``), activations quantized per call
(dynamic). Seven bits keep the integer products exact on every x86 kernel ONNX Runtime picks: with AVX2 alone its
u8 x s8 instruction saturates 8-bit weights, with VNNI it does not, and a verdict must not depend on the CPU.
Measured against ``core.minilm``'s float32 NumPy layers (docs/results.md, "The safety classifier"): six int8 layers
cost about what one float32 NumPy layer does, and the run releases the GIL for the whole pass.

One session per encoder, one intra-op thread: the gateway's request threads call ``run`` concurrently (ONNX
Runtime's sessions are safe for that), and 2 cores do not gain from splitting a 20-token pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

WORD = "embeddings.word_embeddings.weight"
INPUTS = ("ids",)  # (batch, tokens) int64; output "sums": (batch, 384) float32. Every run is one unpadded sequence
LEGACY_MASK = "mask"  # the second input of a graph exported before 2026-11-29: all ones, as the runs have no padding
RUNTIME = "onnx-int8"
# ONNX Runtime's fusion into SkipLayerNormalization: its fused kernel costs about three times the plain Add and
# LayerNormalization at these shapes (a 48-token pass 0.91 of the time without it; docs/results.md, "Fewer
# operators a pass"). Without it the sums differ in their last float bits, and int8 rounding downstream can turn
# that into a few percent of a sum, so a version records the optimizers its threshold was chosen without
# (``onnx_disabled_optimizers`` in classifier.json) and is run without exactly those; a version without the key,
# with all of them, as it was scored.
DISABLED_OPTIMIZERS = ("SkipLayerNormFusion",)


class OnnxMiniLm:
    """What ``core.minilm.MiniLmEncoder`` offers the classifier (``word``, ``layers``, ``source``, ``sum_many``),
    its layers run by ONNX Runtime from ``model`` (the serialized graph). ``source``: the word table only, what a
    folder stores beside the graph for the cascade's screen."""

    runtime = RUNTIME

    def __init__(
        self, model: bytes, word: NDArray[Any], layers: int, disabled_optimizers: tuple[str, ...] = ()
    ) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # warnings about unused initializers are not the user's business
        self.model = model
        self.layers = layers
        self.disabled_optimizers = tuple(disabled_optimizers)
        self.source: Mapping[str, NDArray[Any]] = {WORD: np.asarray(word)}
        self.word = np.asarray(word, dtype=np.float32)
        self._session = ort.InferenceSession(
            model, options, providers=["CPUExecutionProvider"], disabled_optimizers=list(self.disabled_optimizers)
        )
        self._mask = LEGACY_MASK in {i.name for i in self._session.get_inputs()}

    def sum_many(self, seqs: list[NDArray[np.int64]]) -> NDArray[np.float32]:
        """The sum of each sequence's hidden states, (len(seqs), 384), one run per sequence: the activations'
        int8 scale is set per run from the whole input, so a sequence batched with others (padding included)
        would score a little differently from the same sequence alone, which is how training chose the
        threshold. A turn's verdict must not depend on the turns it arrives with."""
        out = np.zeros((len(seqs), self.word.shape[1]), dtype=np.float32)
        for row, s in zip(out, seqs, strict=True):
            ids = np.asarray(s, dtype=np.int64)[None]
            feeds = {"ids": ids, LEGACY_MASK: np.ones_like(ids)} if self._mask else {"ids": ids}
            (sums,) = self._session.run(None, feeds)
            row[:] = sums[0]
        return out
