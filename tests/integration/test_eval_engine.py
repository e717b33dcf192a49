"""The evals' vLLM engine runs in the evaluating process, and leaves that process as it found it."""

from __future__ import annotations

import os

import psutil
import torch

from evals.runner import engine_placement


def test_an_in_process_engine_starts_no_process_and_puts_the_process_state_back(tiny_base_model) -> None:  # type: ignore[no-untyped-def]
    from vllm import LLM, SamplingParams

    me = psutil.Process()
    before_children = {p.pid for p in me.children(recursive=True)}
    set_num_threads, threads, affinity = torch.set_num_threads, torch.get_num_threads(), os.sched_getaffinity(0)
    env = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    for _ in range(2):  # a second engine in the same process (the gate evaluates candidate, then champion)
        with engine_placement(in_process=True):
            llm = LLM(model=str(tiny_base_model.path), dtype="float32", max_model_len=256, seed=0, enforce_eager=True)
            started = {p.pid for p in me.children(recursive=True)} - before_children
            assert started == set(), "vLLM started engine processes"
            out = llm.generate(
                ["<|begin_of_text|><|user|>\nWhat is 2 + 3?<|end|>\n<|assistant|>\n"],
                SamplingParams(max_tokens=8, temperature=0.0),
            )
            assert len(out[0].outputs[0].token_ids) > 0
            assert torch.distributed.is_initialized()  # vLLM's CPU worker joined a group of one
            llm.llm_engine.engine_core.shutdown()
        assert not torch.distributed.is_initialized()
        assert torch.set_num_threads is set_num_threads and torch.get_num_threads() == threads
        assert os.sched_getaffinity(0) == affinity
        assert os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == env
