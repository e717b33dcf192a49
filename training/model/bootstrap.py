"""Offline bootstrap of a base model: ``bootstrap(cfg, snapshot, root) -> ModelFolder``.

1. Train a byte-level BPE tokenizer (``training/model/tokenizer.py``) on the snapshot's train-split text.
2. Pretrain a small Llama (next-token loss on the plain text of the train split: message contents joined,
   documents separated by ``<|end_of_text|>``, no chat markup, so the chat format itself is what fine-tuning
   teaches) with AdamW, linear warm-up and cosine decay, packed sequences, a seeded data order.
3. Save a Hugging Face folder (safetensors, config, generation config, tokenizer, chat template) with
   ``lifecycle.json`` (snapshot, hashes, metrics) and ``loss_curve.json`` beside it.

The folder is ``<root>/<key>`` with ``key`` derived from the snapshot hash and the bootstrap config, so a
second call with the same inputs returns the existing model without training. Same seed, same snapshot, same
thread count: same weights hash. The loss is compared with the unigram entropy of the corpus (the best a model
that ignores context can do), so "it learned" is a number, not a claim.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from core.hashing import sha256_json
from training.config import BootstrapConfig, ModelShape
from training.data.snapshot import Snapshot
from training.model.lr_schedule import warmup_cosine
from training.model.modelio import MANIFEST, ModelFolder, inspect_model_folder, staged_folder, weights_hash
from training.model.tokenizer import DOCUMENT_END, TURN_END, tokenizer_hashes, train_tokenizer


def bootstrap_key(cfg: BootstrapConfig, snapshot: Snapshot) -> str:
    return sha256_json({"snapshot": snapshot.hash, "bootstrap": cfg.model_dump(mode="json")})[:16]


def documents(snapshot: Snapshot, split: str) -> Iterator[str]:
    for record in snapshot.records(split):
        yield "\n\n".join(m["content"] for m in record["messages"] if m["content"])


def _token_stream(tok: PreTrainedTokenizerFast, docs: Iterator[str]) -> torch.Tensor:
    end = int(tok.convert_tokens_to_ids(DOCUMENT_END))  # type: ignore[arg-type]
    ids: list[int] = []
    for doc in docs:
        ids += tok(doc).input_ids  # BOS is prepended by the post-processor
        ids.append(end)
    return torch.tensor(ids, dtype=torch.long)


def unigram_entropy(stream: torch.Tensor, vocab_size: int) -> float:
    """Entropy (nats/token) of the corpus's unigram distribution: the loss floor of a context-free model."""
    counts = torch.bincount(stream, minlength=vocab_size).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())


def _windows(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    n = (len(stream) - 1) // seq_len
    if n < 1:
        raise ValueError("corpus shorter than one sequence")
    return stream[: n * seq_len + 1].unfold(0, seq_len + 1, seq_len)


def _lr(step: int, cfg: BootstrapConfig) -> float:
    p = cfg.pretrain
    return p.learning_rate * warmup_cosine(step, p.warmup_steps, p.steps)


@torch.no_grad()
def _eval_loss(model: LlamaForCausalLM, windows: torch.Tensor, batch_size: int) -> float:
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch_size):
        batch = windows[i : i + batch_size]
        out = model(input_ids=batch, labels=batch)  # the model shifts labels itself
        total += float(out.loss) * len(batch)
        count += len(batch)
    model.train()
    return total / max(1, count)


def llama_config(shape: ModelShape, tok: PreTrainedTokenizerFast) -> LlamaConfig:
    """A Llama of ``shape`` over ``tok``'s vocabulary and special tokens."""
    return LlamaConfig(
        vocab_size=len(tok),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        max_position_embeddings=shape.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta},
        tie_word_embeddings=shape.tie_word_embeddings,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        dtype="float32",
    )


def _build_model(cfg: BootstrapConfig, tok: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    torch.manual_seed(cfg.seed)
    return LlamaForCausalLM(llama_config(cfg.model, tok))


def bootstrap(cfg: BootstrapConfig, snapshot: Snapshot, root: Path, *, progress: bool = True) -> ModelFolder:
    final = root / bootstrap_key(cfg, snapshot)
    if (final / MANIFEST).is_file():
        return inspect_model_folder(final)
    started = time.perf_counter()
    if cfg.pretrain.threads:
        torch.set_num_threads(cfg.pretrain.threads)

    tok = train_tokenizer(documents(snapshot, "train"), cfg.tokenizer, cfg.model.max_position_embeddings)
    train_stream = _token_stream(tok, documents(snapshot, "train"))
    val_stream = _token_stream(tok, documents(snapshot, "validation"))
    seq_len = min(cfg.pretrain.seq_len, cfg.model.max_position_embeddings)
    train_windows = _windows(train_stream, seq_len)
    val_windows = _windows(val_stream, seq_len) if len(val_stream) > seq_len + 1 else train_windows[:8]
    floor = unigram_entropy(train_stream, len(tok))

    model = _build_model(cfg, tok)
    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=cfg.pretrain.learning_rate,
        weight_decay=cfg.pretrain.weight_decay,
        betas=(0.9, 0.95),
    )
    order = torch.Generator().manual_seed(cfg.seed)
    curve: list[dict[str, float]] = []
    val_curve: list[dict[str, float]] = [{"step": 0, "loss": _eval_loss(model, val_windows, cfg.pretrain.batch_size)}]
    tokens_seen, t0 = 0, time.perf_counter()
    bar = tqdm(range(cfg.pretrain.steps), desc="pretrain", unit="step", disable=not progress, mininterval=1.0)
    for step in bar:
        idx = torch.randint(len(train_windows), (cfg.pretrain.batch_size,), generator=order)
        batch = train_windows[idx]
        for group in optimizer.param_groups:
            group["lr"] = _lr(step, cfg)
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        tokens_seen += batch.numel()
        rate = tokens_seen / (time.perf_counter() - t0)
        value = loss.item()
        curve.append({"step": step + 1, "loss": value, "lr": _lr(step, cfg), "tokens_per_s": rate})
        bar.set_postfix(loss=f"{value:.3f}", tok_s=f"{rate:,.0f}", floor=f"{floor:.2f}", refresh=False)
        if (step + 1) % cfg.pretrain.eval_every == 0 or step + 1 == cfg.pretrain.steps:
            val_curve.append({"step": step + 1, "loss": _eval_loss(model, val_windows, cfg.pretrain.batch_size)})
    bar.close()

    with staged_folder(final) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        GenerationConfig(
            bos_token_id=tok.bos_token_id,
            eos_token_id=[tok.eos_token_id, tok.convert_tokens_to_ids(DOCUMENT_END)],
            pad_token_id=tok.pad_token_id,
        ).save_pretrained(tmp)
        window = 20
        metrics: dict[str, Any] = {
            "unigram_entropy": floor,
            "uniform_entropy": math.log(len(tok)),
            "initial_loss": curve[0]["loss"],
            "final_loss": sum(c["loss"] for c in curve[-window:]) / len(curve[-window:]),
            "initial_val_loss": val_curve[0]["loss"],
            "final_val_loss": val_curve[-1]["loss"],
            "tokens_per_s": curve[-1]["tokens_per_s"],
            "train_tokens": int(len(train_stream)),
            "parameters": sum(p.numel() for p in model.parameters()),
        }
        manifest = {
            "kind": "bootstrap",
            "key": final.name,
            "snapshot": snapshot.hash,
            "config": cfg.model_dump(mode="json"),
            "config_hash": cfg.config_hash(),
            "seed": cfg.seed,
            "weights_hash": weights_hash(model),
            **tokenizer_hashes(tmp),
            "eos_token": TURN_END,
            "metrics": metrics,
            "duration_s": round(time.perf_counter() - started, 1),
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "torch_threads": torch.get_num_threads(),
        }
        (tmp / "loss_curve.json").write_text(json.dumps({"train": curve, "validation": val_curve}) + "\n")
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return inspect_model_folder(final)
