"""The harm classifier's text features (``core.harm`` scores with them): WordPiece ids of a text, and the two
sentence embeddings of them, ``StaticEmbedder`` (a per-token table, mean pooled) and ``EncoderEmbedder`` (MiniLM's
first layers, mean pooled; a version's ``encoder_window`` bounds what both its stages read of a turn)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from core.minilm import HIDDEN, MiniLmEncoder, unit_rows
from core.minilm_onnx import WORD, OnnxMiniLm
from core.text import classifier_text

MAX_TOKENS = 512  # a longer text is judged by its first and last 256 tokens
# [CLS] and [SEP] included: a longer turn is judged by its first and last 63 tokens. MiniLM reads 256; 128 keeps a
# long pasted turn within the request path's budget (one thread, 3 unseen turns of the safety_filters benchmark's
# conversations: p99 39 ms at 256, 13.6 at 128; docs/results.md)
ENCODER_MAX_TOKENS = 128
# A version's ``encoder_window`` (classifier.json): the tokens, [CLS] and [SEP] included, that both the screen and the
# encoder read of a turn, a longer one by its head and tail. A version without one reads as before: the encoder
# ENCODER_MAX_TOKENS, the screen every token (docs/results.md, "A window both stages read").
MIN_WINDOW = 8


class _WordPieces:
    """The text -> token ids half both embedders share."""

    max_tokens = MAX_TOKENS

    def __init__(self, tokenizer_json: str, vocab: int, skip_ids: tuple[int, ...]) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_str(tokenizer_json)
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.tokenizer_json = tokenizer_json
        self.skip = np.zeros(vocab, dtype=bool)
        self.skip[list(skip_ids)] = True
        # the tokenizer's whole words (lower case, as MiniLM's uncased vocabulary is): what "h4ck" may spell
        self.words = frozenset(w for w in self.tokenizer.get_vocab() if w.isalpha() and w.isascii())

    def ids(self, text: str) -> NDArray[np.int64]:
        """The token ids of ``read(text)``, without special tokens."""
        return self._ids(self.read(text))

    def read(self, text: str) -> str:
        """The text as the classifier reads it (``core.text.classifier_text``: full-width and look-alike letters
        folded, letter-spaced words joined, digits for letters read back into the tokenizer's words). A long text
        is normalized by its ends only, twice what ``_ids`` keeps of each: a pasted document costs what its ends
        do."""
        n = 8 * self.max_tokens
        if len(text) > 2 * n:
            text = text[:n] + "\n" + text[-n:]
        return classifier_text(text, self.words)

    def _ids(self, text: str) -> NDArray[np.int64]:
        """A long text by its first and last characters (whatever lies beyond ``MAX_TOKENS`` tokens' worth would
        be cut anyway). One ``encode`` per text: ``encode_batch`` starts a thread pool, slower for a few texts and
        contending with the gateway's own threads."""
        n = self.max_tokens
        if len(text) > 8 * n:
            text = text[: 4 * n] + "\n" + text[-4 * n :]
        return self._encode(text)

    def _encode(self, text: str) -> NDArray[np.int64]:
        ids = np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)
        return ids[~self.skip[ids]]

    def head_and_tail(self, ids: NDArray[np.int64], n: int) -> NDArray[np.int64]:
        """At most ``n`` ids: a longer text by its first and last ``n // 2`` (the newest turn of joined turns
        stays in)."""
        return np.concatenate([ids[: n // 2], ids[len(ids) - (n - n // 2) :]]) if len(ids) > n else ids

    def sums(self, seqs: list[NDArray[np.int64]]) -> NDArray[np.float32]:
        """(len(seqs), dim): the sum of each sequence's token vectors, before pooling: sequences embedded apart
        pool together by adding these."""
        raise NotImplementedError

    def pool(self, ids: NDArray[np.int64]) -> NDArray[np.float32]:
        return self.pool_many([ids])[0]

    def pool_many(self, seqs: list[NDArray[np.int64]]) -> NDArray[np.float32]:
        """The mean of each sequence's token vectors, L2-normalized (the normalized sum)."""
        return unit_rows(self.sums(seqs))

    @property
    def dim(self) -> int:
        raise NotImplementedError

    def embed(self, texts: list[str]) -> NDArray[np.float32]:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self.pool(self.ids(t)) for t in texts])


class StaticEmbedder(_WordPieces):
    """Texts -> mean of their tokens' table rows, L2-normalized (one row per text)."""

    def __init__(self, tokenizer_json: str, table: NDArray[Any], skip_ids: tuple[int, ...]) -> None:
        super().__init__(tokenizer_json, table.shape[0], skip_ids)
        self.table = np.asarray(table, dtype=np.float32)  # float16 on disk; float32 here (NumPy's float16 is slow)

    @property
    def dim(self) -> int:
        return int(self.table.shape[1])

    def sums(self, seqs: list[NDArray[np.int64]]) -> NDArray[np.float32]:
        out = np.zeros((len(seqs), self.dim), dtype=np.float32)
        for row, ids in zip(out, seqs, strict=True):
            row[:] = self.table[self.head_and_tail(ids, MAX_TOKENS)].sum(axis=0)
        return out


class EncoderEmbedder(_WordPieces):
    """Texts -> ``[CLS] ids [SEP]`` through MiniLM's first layers, mean pooled, L2-normalized: float32 NumPy
    (``core.minilm``; ``weights``: BertModel's tensors, ``core.minilm.param_names``, any float dtype) or an int8
    ONNX Runtime graph (``core.minilm_onnx``; ``onnx_model``, and ``weights`` needs the word table only)."""

    max_tokens = ENCODER_MAX_TOKENS

    def __init__(
        self,
        tokenizer_json: str,
        weights: Mapping[str, NDArray[Any]],
        layers: int,
        cls_sep: tuple[int, int],
        onnx_model: bytes | None = None,
        window: int | None = None,
        disabled_optimizers: tuple[str, ...] = (),
    ) -> None:
        if window is not None and not MIN_WINDOW <= window <= ENCODER_MAX_TOKENS:
            raise ValueError(f"encoder window {window}: between {MIN_WINDOW} and {ENCODER_MAX_TOKENS} tokens")
        self.window = window
        # the layers in NumPy from ``weights``, or in ONNX Runtime from ``onnx_model`` (``weights``: the word table),
        # run without the graph optimizers the version was scored without (``core.minilm_onnx.DISABLED_OPTIMIZERS``)
        self.encoder: MiniLmEncoder | OnnxMiniLm = (
            MiniLmEncoder(weights, layers)
            if onnx_model is None
            else OnnxMiniLm(onnx_model, weights[WORD], layers, disabled_optimizers)
        )
        # no id skipped: the encoder reads what MiniLM's tokenizer makes of the text
        super().__init__(tokenizer_json, self.encoder.word.shape[0], ())
        self.cls_sep = cls_sep

    @property
    def dim(self) -> int:
        return HIDDEN

    def _ids(self, text: str) -> NDArray[np.int64]:
        """With a ``window``, a turn longer than it by its head and tail: what the screen and the encoder both read,
        so the screen's mean is not diluted by a pasted document the encoder never sees, and a pass costs at most
        the window's tokens (~0.11 ms a token on one thread)."""
        if self.window is None:
            return super()._ids(text)
        n = self.window - 2
        ends = self._ends(text, n)
        return ends if ends is not None else self.head_and_tail(super()._ids(text), n)

    def _ends(self, text: str, n: int) -> NDArray[np.int64] | None:
        """``head_and_tail(ids(text), n)`` from the text's two ends alone: tokenizing a pasted turn whole (its first
        and last 512 characters, what ``ids`` reads) costs ~2.6 times what its ends do, and holds the GIL. Exact:
        BERT's tokenizer reads each word on its own (normalizing character by character, splitting at whitespace
        and punctuation), so text cut at a space gives the same tokens for the words it keeps. The ends grow until
        each holds its half of the window (None when they would reach past what ``ids`` reads of a long text, or
        meet: the whole text is tokenized then)."""
        head_n, tail_n = n // 2, n - n // 2
        chars = 4 * n  # ~2x what half a window of English takes; doubled while short
        while chars <= 4 * self.max_tokens and 2 * chars < len(text):
            head_end, tail_start = text.rfind(" ", 0, chars), text.find(" ", len(text) - chars)
            if head_end > 0 and tail_start >= 0:
                head, tail = (self._encode(part) for part in (text[:head_end], text[tail_start + 1 :]))
                if len(head) >= head_n and len(tail) >= tail_n and len(head) + len(tail) > n:
                    return np.concatenate([head[:head_n], tail[len(tail) - tail_n :]])
            chars *= 2
        return None

    def framed(self, ids: NDArray[np.int64]) -> NDArray[np.int64]:
        """``[CLS] ids [SEP]``, a long text by its head and tail: what the encoder reads (and training feeds it)."""
        cls_id, sep_id = self.cls_sep
        return np.concatenate([[cls_id], self.head_and_tail(ids, ENCODER_MAX_TOKENS - 2), [sep_id]]).astype(np.int64)

    def sums(self, seqs: list[NDArray[np.int64]]) -> NDArray[np.float32]:
        """One encoder pass for all of ``seqs`` (the turns ``judge_turns`` has not seen yet, together)."""
        return self.encoder.sum_many([self.framed(ids) for ids in seqs])

    def word_sums(self, seqs: list[NDArray[np.int64]]) -> NDArray[np.float32]:
        """(len(seqs), 384): the sum of each sequence's input word vectors, no layer run: the ``Screen``'s
        features (normalized: their mean's direction)."""
        out = np.zeros((len(seqs), HIDDEN), dtype=np.float32)
        for row, ids in zip(out, seqs, strict=True):
            row[:] = self.encoder.word[ids].sum(axis=0)
        return out


Embedder = StaticEmbedder | EncoderEmbedder
