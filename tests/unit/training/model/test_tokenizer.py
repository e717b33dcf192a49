from __future__ import annotations

from pathlib import Path

import pytest

from training.config import GeneratorConfig, TokenizerConfig
from training.data.synth import generate
from training.model.tokenizer import SPECIAL_TOKENS, TURN_END, tokenizer_hashes, train_tokenizer


@pytest.fixture(scope="module")
def texts() -> list[str]:
    records = generate(GeneratorConfig(counts={"arithmetic": 100, "refusal": 20, "borderline": 10}))
    return [m["content"] for r in records for m in r["messages"]]


def test_special_tokens_are_single_ids_and_eos_ends_turns(texts: list[str]) -> None:
    tok = train_tokenizer(texts, TokenizerConfig(vocab_size=400), 128)
    for special in SPECIAL_TOKENS:
        assert len(tok(special, add_special_tokens=False).input_ids) == 1
    assert tok.eos_token == TURN_END
    assert tok("hi").input_ids[0] == tok.bos_token_id
    assert tok.decode(tok("Compute 12 x 7.", add_special_tokens=False).input_ids) == "Compute 12 x 7."


def test_chat_template_and_assistant_mask(texts: list[str]) -> None:
    tok = train_tokenizer(texts, TokenizerConfig(vocab_size=400), 128)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "The answer is 4."},
    ]
    text = tok.apply_chat_template(messages, tokenize=False)
    assert text == (
        "<|begin_of_text|><|system|>\nBe brief.<|end|>\n<|user|>\nWhat is 2 + 2?<|end|>\n"
        "<|assistant|>\nThe answer is 4.<|end|>\n"
    )
    prompt = tok.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|user|>\nWhat is 2 + 2?<|end|>\n<|assistant|>\n")
    out = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    masked = [i for i, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m]
    assert tok.decode(masked) == "The answer is 4.<|end|>"  # loss on the answer and its end-of-turn only


def test_training_is_deterministic_and_hashes_identify_it(texts: list[str], tmp_path: Path) -> None:
    a = train_tokenizer(texts, TokenizerConfig(vocab_size=400), 128)
    b = train_tokenizer(texts, TokenizerConfig(vocab_size=400), 128)
    c = train_tokenizer(texts, TokenizerConfig(vocab_size=350), 128)
    for name, tok in {"a": a, "b": b, "c": c}.items():
        tok.save_pretrained(tmp_path / name)
    ha, hb, hc = (tokenizer_hashes(tmp_path / n) for n in "abc")
    assert ha == hb
    assert ha["tokenizer_hash"] != hc["tokenizer_hash"]
    assert ha["chat_template_hash"] == hc["chat_template_hash"]


def test_every_digit_is_its_own_token_in_any_context(texts: list[str]) -> None:
    tok = train_tokenizer(texts, TokenizerConfig(vocab_size=400), 128)
    for text, number in (("The answer is 1920.", "1920"), ("Compute 12 x 7.", "127"), ("a-35b", "35")):
        pieces = tok.convert_ids_to_tokens(tok(text, add_special_tokens=False).input_ids)
        assert [p for p in pieces if any(c.isdigit() for c in p)] == list(number), pieces
        assert tok.decode(tok(text, add_special_tokens=False).input_ids) == text
    merged = train_tokenizer(texts + ["1920 minutes"] * 50, TokenizerConfig(vocab_size=400, split_digits=False), 128)
    pieces = merged.convert_ids_to_tokens(merged("The answer is 1920.", add_special_tokens=False).input_ids)
    assert any(sum(c.isdigit() for c in p) > 1 for p in pieces), pieces  # plain BPE merges digit runs
