"""The harm classifier's encoder fine-tuning (``training.classifier.fit`` calls ``finetune_encoder``): MiniLM's
layers and the head trained together on the training split, and with ``finetune_feed_forward`` the tuned layers cut
to fewer feed-forward neurons (``prune_feed_forward``) and distilled from the uncut ones. Torch computes what
``core.minilm`` computes; the result embeds with float16 tensors, what a folder stores."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from core.harm import EncoderEmbedder, HarmClassifier
from core.minilm import HIDDEN, param_names
from training.classifier_config import SafetyClassifierConfig


def finetune_encoder(
    cfg: SafetyClassifierConfig, clf: HarmClassifier, records: list[dict[str, str]], weights: NDArray[np.float64]
) -> HarmClassifier:
    """``clf``'s encoder layers and head trained together on ``records`` (weighted cross-entropy, AdamW with a
    6% warm-up and a linear decay, ``cfg.finetune_*``), starting from its logistic regression. The result embeds
    with the fine-tuned tensors rounded to the float16 its folder stores, so the threshold chosen on it holds for
    the served version. Torch computes what ``core.minilm`` computes (``BertModel``'s first layers, a padding mask,
    the mean over each prompt's tokens, L2 norm)."""
    import torch

    embedder = clf.embedder
    if not isinstance(embedder, EncoderEmbedder):
        raise TypeError("fine-tuning needs the encoder features")
    threads = torch.get_num_threads()
    # one thread: these are small matrices (a batch of short prompts, 384 wide), and with a second busy core two
    # threads stall on each other (measured on the 2-core machine: 9.4 min against ~2 min on one thread)
    torch.set_num_threads(1)
    try:
        return _finetune(cfg, clf, embedder, records, weights)
    finally:
        torch.set_num_threads(threads)


def _padded(seqs: list[NDArray[np.int64]], idx: NDArray[np.int64]) -> tuple[Any, Any]:
    """``seqs[idx]`` as one batch: token ids padded with 0 and the attention mask (torch long tensors)."""
    import torch

    ids = torch.zeros((len(idx), max(len(seqs[i]) for i in idx)), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, i in enumerate(idx):
        ids[row, : len(seqs[i])] = torch.from_numpy(seqs[i])
        mask[row, : len(seqs[i])] = 1
    return ids, mask


def prune_feed_forward(
    source: Mapping[str, NDArray[Any]], layers: int, keep: int, seqs: list[NDArray[np.int64]], seed: int
) -> dict[str, NDArray[Any]]:
    """``source`` with each layer's feed-forward cut to the ``keep`` neurons that matter most: by the mean
    |activation| (after GELU) over the tokens of up to 1024 of ``seqs`` (a seeded sample), times the norm of the
    neuron's output weights (what it can add to the residual stream). The rest of ``source`` is unchanged."""
    import torch

    from training.onnx_encoder import bert_model

    bert = bert_model(source, layers)
    width = bert.config.intermediate_size
    if keep >= width:
        return dict(source)
    sample = np.random.default_rng(seed).permutation(len(seqs))[:1024]
    totals = [torch.zeros(width) for _ in range(layers)]
    tokens = 0
    mask: torch.Tensor | None = None

    def hook(i: int) -> Any:
        def record(_module: Any, _inputs: Any, out: torch.Tensor) -> None:
            assert mask is not None
            totals[i] += (out.abs() * mask[..., None].float()).sum((0, 1))

        return record

    handles = [bert.encoder.layer[i].intermediate.register_forward_hook(hook(i)) for i in range(layers)]
    try:
        with torch.no_grad():
            for start in range(0, len(sample), 64):
                ids, mask = _padded(seqs, sample[start : start + 64])
                bert(input_ids=ids, attention_mask=mask)
                tokens += int(mask.sum())
    finally:
        for h in handles:
            h.remove()
    out = dict(source)
    for i in range(layers):
        pre = f"encoder.layer.{i}."
        down = np.asarray(source[pre + "output.dense.weight"])  # (384, width)
        importance = totals[i].numpy() / max(tokens, 1) * np.linalg.norm(down.astype(np.float32), axis=0)
        kept = np.sort(np.argsort(-importance, kind="stable")[:keep])
        out[pre + "intermediate.dense.weight"] = np.asarray(source[pre + "intermediate.dense.weight"])[kept]
        out[pre + "intermediate.dense.bias"] = np.asarray(source[pre + "intermediate.dense.bias"])[kept]
        out[pre + "output.dense.weight"] = down[:, kept]
    return out


# The distillation that follows a feed-forward cut (``finetune_feed_forward``): cross-entropy on the labels and the
# KL divergence from the uncut model's probabilities at temperature 2, half each, plus 10 times (1 - cosine) between
# the two models' pooled vectors. The cosine term is what kept prompts written by people: without it the cut model
# matched the uncut one's probabilities on training prompts and lost more recall on the external slice
# (docs/results.md, "Cut after fine-tuning, then distilled").
DISTILL_CE = 0.5
DISTILL_TEMPERATURE = 2.0
DISTILL_COSINE = 10.0


def _finetune(
    cfg: SafetyClassifierConfig,
    clf: HarmClassifier,
    embedder: EncoderEmbedder,
    records: list[dict[str, str]],
    weights: NDArray[np.float64],
) -> HarmClassifier:
    import torch

    from training.onnx_encoder import bert_model

    torch.manual_seed(cfg.seed)
    source = embedder.encoder.source
    seqs = [embedder.framed(embedder.ids(r["text"])) for r in records]
    bert = bert_model(source, embedder.encoder.layers)
    bert.embeddings.word_embeddings.weight.requires_grad_(cfg.finetune_word_embeddings)
    head = torch.nn.Linear(HIDDEN, len(clf.labels))
    with torch.no_grad():
        head.weight.copy_(torch.from_numpy(clf.coef_t.T.copy()))
        head.bias.copy_(torch.from_numpy(clf.intercept.copy()))
    labels = torch.tensor([clf.labels.index(r["label"]) for r in records])
    sample_weights = torch.tensor(weights / weights.mean(), dtype=torch.float32)

    def cross_entropy(idx: NDArray[np.int64], logits: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.cross_entropy(logits, labels[idx], reduction="none")
        return (loss * sample_weights[idx]).mean()

    lrs = (cfg.finetune_lr, cfg.finetune_head_lr)
    _train(cfg, bert, head, seqs, cfg.finetune_epochs, lrs, lambda idx, logits, _pooled: cross_entropy(idx, logits))
    if cfg.finetune_feed_forward is not None:
        bert, head = _distill_cut(cfg, bert, head, seqs, embedder.encoder.layers, cross_entropy)
    state = bert.state_dict()
    tuned = {n: state[n].detach().numpy().astype(np.float16) for n in source}
    return HarmClassifier(
        clf.labels,
        EncoderEmbedder(
            embedder.tokenizer_json, tuned, embedder.encoder.layers, embedder.cls_sep, window=embedder.window
        ),
        head.weight.detach().double().numpy(),
        head.bias.detach().double().numpy(),
        clf.threshold,
    )


def _train(
    cfg: SafetyClassifierConfig,
    bert: Any,
    head: Any,
    seqs: list[NDArray[np.int64]],
    epochs: float,
    lrs: tuple[float, float],
    loss_of: Any,
) -> None:
    """``epochs`` passes over ``seqs`` in shuffled batches, AdamW (layers, head at ``lrs``) with a 6% warm-up and a
    linear decay; ``loss_of(idx, logits, pooled)``: the batch's loss from the head's logits and the pooled vectors
    (the mean over each prompt's tokens, L2-normalized)."""
    import torch

    batch = cfg.finetune_batch_size
    steps = max(1, math.ceil(math.ceil(len(seqs) / batch) * epochs))
    opt = torch.optim.AdamW(
        [
            {"params": [p for p in bert.parameters() if p.requires_grad], "lr": lrs[0]},
            {"params": list(head.parameters()), "lr": lrs[1]},
        ],
        weight_decay=0.01,
        foreach=True,  # one fused update for all tensors (CPU's default is a Python loop per tensor)
    )
    warmup = max(1.0, 0.06 * steps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * (steps - s) / steps)
    rng = np.random.default_rng(cfg.seed)
    bert.train()
    step = 0
    while step < steps:
        order = rng.permutation(len(seqs))
        for start in range(0, len(order), batch):
            if step >= steps:
                break
            idx = order[start : start + batch]
            pooled = _pooled(bert, seqs, idx)
            loss = loss_of(idx, head(pooled), pooled)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step += 1
    bert.eval()


def _pooled(bert: Any, seqs: list[NDArray[np.int64]], idx: NDArray[np.int64]) -> Any:
    import torch

    ids, mask = _padded(seqs, idx)
    hidden = bert(input_ids=ids, attention_mask=mask).last_hidden_state
    return torch.nn.functional.normalize((hidden * mask[..., None]).sum(1), dim=-1)


def _distill_cut(
    cfg: SafetyClassifierConfig, teacher: Any, teacher_head: Any, seqs: list[NDArray[np.int64]], layers: int, ce: Any
) -> tuple[Any, Any]:
    """The fine-tuned layers cut to ``finetune_feed_forward`` neurons (``prune_feed_forward``, on the training
    prompts), then trained for ``distill_epochs`` to answer as the uncut model does (``DISTILL_*``), starting from
    its head (at a tenth of ``finetune_head_lr``). Cutting MiniLM before fine-tuning lost more of the catch on
    prompts written by people (docs/results.md)."""
    import copy

    import torch

    from training.onnx_encoder import bert_model

    teacher.eval()
    with torch.no_grad():
        parts = [_pooled(teacher, seqs, np.arange(s, min(len(seqs), s + 128))) for s in range(0, len(seqs), 128)]
        t_pooled = torch.cat(parts)
        t_probs = torch.softmax(teacher_head(t_pooled) / DISTILL_TEMPERATURE, dim=-1)
    state = teacher.state_dict()
    tuned = {n: state[n].detach().numpy() for n in param_names(layers)}
    student = bert_model(prune_feed_forward(tuned, layers, cfg.finetune_feed_forward or 0, seqs, cfg.seed), layers)
    student.embeddings.word_embeddings.weight.requires_grad_(cfg.finetune_word_embeddings)
    head = copy.deepcopy(teacher_head)

    def loss_of(idx: NDArray[np.int64], logits: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        t = DISTILL_TEMPERATURE
        kl = torch.nn.functional.kl_div(torch.log_softmax(logits / t, dim=-1), t_probs[idx], reduction="batchmean")
        cosine = (1 - (pooled * t_pooled[idx]).sum(-1)).mean()
        return DISTILL_CE * ce(idx, logits) + (1 - DISTILL_CE) * kl * t * t + DISTILL_COSINE * cosine

    _train(cfg, student, head, seqs, cfg.distill_epochs, (cfg.finetune_lr, cfg.finetune_head_lr / 10), loss_of)
    return student, head
