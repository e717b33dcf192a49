"""vLLM's engine serves the bootstrapped folder, and agrees with Hugging Face ``generate`` token for token."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = [
    [{"role": "user", "content": "What is 12 + 7?"}],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Convert 3 km to m."},
    ],
]

# slow: an engine start of its own (~1 min); every serving test runs vLLM through the gateway, and
# benchmarks/eval_suites.py checks vLLM's greedy outputs equal transformers' on every run
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def llm(tiny_base_model):  # type: ignore[no-untyped-def]
    from vllm import LLM

    engine = LLM(
        model=str(tiny_base_model.path),
        dtype="float32",
        max_model_len=256,
        seed=0,
        enable_prefix_caching=True,
    )
    yield engine
    engine.llm_engine.engine_core.shutdown()  # stop the EngineCore process now, not at interpreter exit


def test_vllm_greedy_chat_matches_transformers(llm, tiny_base_model) -> None:  # type: ignore[no-untyped-def]
    """Same template, same weights, same stop tokens: greedy decoding must agree token for token."""
    from vllm import SamplingParams

    outputs = llm.chat(PROMPTS, SamplingParams(max_tokens=16, temperature=0.0))
    tok = AutoTokenizer.from_pretrained(str(tiny_base_model.path))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_base_model.path))
    stops = set(model.generation_config.eos_token_id)
    for messages, out in zip(PROMPTS, outputs, strict=True):
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)[
            "input_ids"
        ]
        assert list(out.prompt_token_ids) == ids[0].tolist()  # same template, one BOS
        hf = model.generate(ids, max_new_tokens=16, do_sample=False)[0, ids.shape[1] :].tolist()
        vllm_ids = list(out.outputs[0].token_ids)
        assert vllm_ids == hf[: len(vllm_ids)] and len(vllm_ids) > 0
        assert len(vllm_ids) == len(hf) or hf[len(vllm_ids)] in stops


def test_vllm_stops_at_the_end_of_turn_token(llm, tiny_base_model) -> None:  # type: ignore[no-untyped-def]
    from vllm import SamplingParams

    tok = AutoTokenizer.from_pretrained(str(tiny_base_model.path))
    out = llm.generate(
        ["<|begin_of_text|><|user|>\nhi<|end|>\n<|assistant|>\n"],
        SamplingParams(max_tokens=64, temperature=1.0, seed=3),
    )[0].outputs[0]
    end = tok.convert_tokens_to_ids("<|end|>")
    assert end not in out.token_ids[:-1]  # generation never runs past an end-of-turn
    if out.finish_reason == "stop":
        assert out.token_ids[-1] in (end, tok.convert_tokens_to_ids("<|end_of_text|>"))
