"""The first layers of all-MiniLM-L6-v2 in NumPy: token ids -> a mean-pooled, L2-normalized sentence vector, with no
torch. The harm classifier's ``encoder`` features (``core.harm``) run it on every prompt the gateway pre-filters,
so it is written for one sequence on one thread: float32 matmuls, Q/K/V fused into one, no padding or masks. The
matmuls run with BLAS limited to one thread (threadpoolctl, where installed): OpenBLAS splits these small products
over every core and, on a busy 2-core machine, its spinning threads made a 20-token prompt ~350 ms instead of ~8.

    enc = MiniLmEncoder.from_weights(load_file("model.safetensors"), layers=2)   # BertModel's tensor names
    enc.encode(np.array([101, 7592, 102]))                                       # (384,) float32, unit norm

It computes what ``transformers``' ``BertModel`` computes with ``encoder.layer[:layers]``: word + position +
token-type (0) embeddings and LayerNorm, then per layer 12-head self-attention, output dense + residual +
LayerNorm, intermediate dense with BERT's erf GELU, output dense + residual + LayerNorm; then the mean over all
tokens ([CLS] and [SEP] included, as sentence-transformers pools with a full attention mask) and L2 norm.
tests/unit/core/test_harm_encoder.py checks it against torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

HIDDEN = 384
HEADS = 12
EPS = 1e-12  # BERT's layer_norm_eps
LAYER_PARAMS = (
    "attention.self.query.weight",
    "attention.self.query.bias",
    "attention.self.key.weight",
    "attention.self.key.bias",
    "attention.self.value.weight",
    "attention.self.value.bias",
    "attention.output.dense.weight",
    "attention.output.dense.bias",
    "attention.output.LayerNorm.weight",
    "attention.output.LayerNorm.bias",
    "intermediate.dense.weight",
    "intermediate.dense.bias",
    "output.dense.weight",
    "output.dense.bias",
    "output.LayerNorm.weight",
    "output.LayerNorm.bias",
)
EMBEDDING_PARAMS = (
    "embeddings.word_embeddings.weight",
    "embeddings.position_embeddings.weight",
    "embeddings.token_type_embeddings.weight",
    "embeddings.LayerNorm.weight",
    "embeddings.LayerNorm.bias",
)


def param_names(layers: int) -> list[str]:
    """The BertModel tensors the first ``layers`` layers read (what a classifier folder stores)."""
    return [*EMBEDDING_PARAMS, *(f"encoder.layer.{i}.{p}" for i in range(layers) for p in LAYER_PARAMS)]


def _layer_norm(x: NDArray[np.float32], w: NDArray[np.float32], b: NDArray[np.float32]) -> NDArray[np.float32]:
    mu = x.mean(axis=-1, keepdims=True)
    x = x - mu
    var = (x * x).mean(axis=-1, keepdims=True)
    return x / np.sqrt(var + EPS) * w + b


def _erf(x: NDArray[np.float32]) -> NDArray[np.float32]:
    """Abramowitz & Stegun 7.1.26 (max error 1.5e-7): NumPy has no erf, and the core must not need SciPy."""
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return s * (1.0 - poly * np.exp(-a * a))


def _gelu(x: NDArray[np.float32]) -> NDArray[np.float32]:
    return 0.5 * x * (1.0 + _erf(x * np.float32(0.7071067811865476)))


class _Layer:
    def __init__(self, w: Mapping[str, NDArray[Any]], prefix: str) -> None:
        def get(name: str) -> NDArray[np.float32]:
            return np.asarray(w[prefix + name], dtype=np.float32)

        def dense(name: str) -> NDArray[np.float32]:  # torch's (out, in) -> (in, out), contiguous for x @ W
            return np.ascontiguousarray(get(name).T)

        qkv = [dense(f"attention.self.{n}.weight") for n in ("query", "key", "value")]
        self.qkv = np.ascontiguousarray(np.concatenate(qkv, axis=1))
        # the 1/sqrt(head size) of the scores folded into the query's weights and bias
        scale = np.float32(1.0 / np.sqrt(HIDDEN // HEADS))
        self.qkv[:, :HIDDEN] *= scale
        self.qkv_b = np.concatenate([get(f"attention.self.{n}.bias") for n in ("query", "key", "value")])
        self.qkv_b[:HIDDEN] *= scale
        self.out, self.out_b = dense("attention.output.dense.weight"), get("attention.output.dense.bias")
        self.ln1 = get("attention.output.LayerNorm.weight"), get("attention.output.LayerNorm.bias")
        self.up, self.up_b = dense("intermediate.dense.weight"), get("intermediate.dense.bias")
        self.down, self.down_b = dense("output.dense.weight"), get("output.dense.bias")
        self.ln2 = get("output.LayerNorm.weight"), get("output.LayerNorm.bias")

    def __call__(self, x: NDArray[np.float32], spans: list[tuple[int, int]]) -> NDArray[np.float32]:
        """``x``: the rows of one or more sequences packed together, ``spans`` their (start, end): the dense layers
        read the weights once for all of them, attention stays within each span."""
        n = x.shape[0]
        qkv = (x @ self.qkv + self.qkv_b).reshape(n, 3, HEADS, HIDDEN // HEADS).transpose(1, 2, 0, 3)
        ctx = np.empty((n, HIDDEN), dtype=np.float32)
        for a, b in spans:
            q, k, v = qkv[0, :, a:b], qkv[1, :, a:b], qkv[2, :, a:b]  # (heads, tokens, head size) each
            scores = q @ k.transpose(0, 2, 1)
            scores -= scores.max(axis=-1, keepdims=True)
            p = np.exp(scores)
            p /= p.sum(axis=-1, keepdims=True)
            ctx[a:b] = (p @ v).transpose(1, 0, 2).reshape(b - a, HIDDEN)
        x = _layer_norm(ctx @ self.out + self.out_b + x, *self.ln1)
        return _layer_norm(_gelu(x @ self.up + self.up_b) @ self.down + self.down_b + x, *self.ln2)


def _one_blas_thread() -> Callable[[], contextlib.AbstractContextManager[Any]]:
    """A context manager factory limiting BLAS to one thread for its block (the libraries probed once, here)."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # NumPy alone: whatever OPENBLAS_NUM_THREADS / OMP_NUM_THREADS say
        return contextlib.nullcontext
    controller = ThreadpoolController()
    return lambda: controller.limit(limits=1, user_api="blas")


class MiniLmEncoder:
    """MiniLM's embeddings and first ``layers`` layers, float32 in memory whatever the stored dtype."""

    def __init__(self, weights: Mapping[str, NDArray[Any]], layers: int) -> None:
        missing = [n for n in param_names(layers) if n not in weights]
        if missing:
            raise ValueError(f"MiniLM weights lack {len(missing)} tensors, e.g. {missing[0]!r}")
        self.layers = layers
        # the tensors as given (float16 from a classifier folder): what a save writes back, bit for bit
        self.source = {n: np.asarray(weights[n]) for n in param_names(layers)}
        self.word = np.asarray(weights["embeddings.word_embeddings.weight"], dtype=np.float32)
        # token type 0 is every token's: its row folded into the position rows once
        self.position = np.asarray(weights["embeddings.position_embeddings.weight"], dtype=np.float32) + np.asarray(
            weights["embeddings.token_type_embeddings.weight"][0], dtype=np.float32
        )
        self.ln = (
            np.asarray(weights["embeddings.LayerNorm.weight"], dtype=np.float32),
            np.asarray(weights["embeddings.LayerNorm.bias"], dtype=np.float32),
        )
        self._layers = [_Layer(weights, f"encoder.layer.{i}.") for i in range(layers)]
        self._one_thread = _one_blas_thread()

    @property
    def max_positions(self) -> int:
        return int(self.position.shape[0])

    def hidden(self, ids: NDArray[np.int64]) -> NDArray[np.float32]:
        """(len(ids), 384) hidden states after the last layer; ``ids`` with [CLS]/[SEP] already in place."""
        return self._packed([ids])[0]

    def _packed(self, seqs: list[NDArray[np.int64]]) -> tuple[NDArray[np.float32], list[tuple[int, int]]]:
        ends = np.cumsum([len(s) for s in seqs])
        spans = [(int(e - len(s)), int(e)) for s, e in zip(seqs, ends, strict=True)]
        positions = np.concatenate([np.arange(len(s)) for s in seqs])
        x = _layer_norm(self.word[np.concatenate(seqs)] + self.position[positions], *self.ln)
        with self._one_thread():
            for layer in self._layers:
                x = layer(x, spans)
        return x, spans

    def encode(self, ids: NDArray[np.int64]) -> NDArray[np.float32]:
        """The mean of the hidden states, L2-normalized: (384,)."""
        return self.encode_many([ids])[0]

    def encode_many(self, seqs: list[NDArray[np.int64]]) -> NDArray[np.float32]:
        """``encode`` of each sequence, (len(seqs), 384), in one pass: the weights are read once (on a busy
        machine the passes are bound by that, not by arithmetic), so two short sequences cost about one."""
        return unit_rows(self.sum_many(seqs))

    def sum_many(self, seqs: list[NDArray[np.int64]]) -> NDArray[np.float32]:
        """The sum of each sequence's hidden states, (len(seqs), 384), in one pass: what ``encode_many``
        normalizes, and what sequences encoded apart add up to when they are pooled together."""
        x, spans = self._packed(seqs)
        return np.stack([x[a:b].sum(axis=0) for a, b in spans])


def unit_rows(x: NDArray[np.float32]) -> NDArray[np.float32]:
    """Each row L2-normalized (a zero row stays zero): a mean pooled row normalizes to the same as its sum."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.asarray(x / np.where(norms > 0, norms, 1.0), dtype=np.float32)
