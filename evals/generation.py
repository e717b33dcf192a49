"""Batched chat generation for the sampled suites (toxicity, safety, over-refusal), behind a small Protocol.

- ``VllmChat``: one batched ``LLM.chat`` call per suite on an in-process vLLM engine (continuous batching; LoRA
  versions as a ``LoRARequest`` on their base engine). Each request carries its own seed, so a sampled
  completion depends only on (seed, item, sample), not on batch composition. ``greedy`` also says whether each
  reply ended on its own (the self-replies stage trims or drops a reply cut at ``max_tokens``).
- ``OpenAIChat``: any OpenAI-compatible endpoint through the official client, requests in parallel; ``seed`` is
  passed and honoured by vLLM-based servers.
- ``ScreenedChat``: a ``ChatModel`` as the endpoint serves it (``evals.as_served``): a ``Screen`` (the gateway's
  safety filters, built by the flows) answers the prompts it blocks itself and passes every reply through its
  post-filter; the model sees only the prompts that pass, each with the seed it would have had.

Tests of pure logic use ``FakeChat``-style classes implementing ``ChatModel``.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class Sampling:
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    n: int = 1


class ChatModel(Protocol):
    def chat(self, conversations: Sequence[Messages], sampling: Sampling, seeds: Sequence[int]) -> list[list[str]]:
        """``sampling.n`` completions per conversation, the i-th conversation sampled with ``seeds[i]``."""
        ...


@dataclass(frozen=True)
class Completion:
    text: str
    finished: bool  # ended on its own (a stop token), not cut at max_tokens


class VllmChat:
    def __init__(self, llm: Any, lora_request: Any | None = None) -> None:
        self.llm = llm
        self.lora_request = lora_request

    def chat(self, conversations: Sequence[Messages], sampling: Sampling, seeds: Sequence[int]) -> list[list[str]]:
        from vllm import SamplingParams

        params = [
            SamplingParams(
                n=sampling.n,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                max_tokens=sampling.max_tokens,
                seed=seed,
            )
            for seed in seeds
        ]
        outputs = self.llm.chat(
            list(conversations), sampling_params=params, lora_request=self.lora_request, use_tqdm=False
        )
        return [[c.text for c in out.outputs] for out in outputs]

    def greedy(self, conversations: Sequence[Messages], max_tokens: int) -> list[Completion]:
        """One greedy reply per conversation, and whether it ended before ``max_tokens`` (the self-replies stage:
        ``training/data/self_replies.py``)."""
        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        outputs = self.llm.chat(
            list(conversations), sampling_params=params, lora_request=self.lora_request, use_tqdm=False
        )
        return [Completion(out.outputs[0].text, out.outputs[0].finish_reason == "stop") for out in outputs]


class OpenAIChat:
    def __init__(self, base_url: str, model: str, api_key: str = "EMPTY", concurrency: int = 8) -> None:
        from openai import OpenAI

        self.client = OpenAI(base_url=base_url, api_key=api_key, max_retries=2, timeout=300)
        self.model = model
        self.concurrency = concurrency

    def _one(self, messages: Messages, sampling: Sampling, seed: int) -> list[tuple[str, str | None]]:
        resp = self.client.chat.completions.create(
            model=self.model,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            n=sampling.n,
            seed=seed,
        )
        return [(c.message.content or "", c.finish_reason) for c in sorted(resp.choices, key=lambda c: c.index)]

    def answers(
        self, conversations: Sequence[Messages], sampling: Sampling, seeds: Sequence[int]
    ) -> list[list[tuple[str, str | None]]]:
        """Each conversation's replies with their finish_reason (``content_filter``: the endpoint's safety filter
        answered or stopped it, not the model alone)."""
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(lambda a: self._one(a[0], sampling, a[1]), zip(conversations, seeds, strict=True)))

    def chat(self, conversations: Sequence[Messages], sampling: Sampling, seeds: Sequence[int]) -> list[list[str]]:
        return [[text for text, _ in replies] for replies in self.answers(conversations, sampling, seeds)]


class Screen(Protocol):
    """The endpoint's safety filters in front of a model (implemented over the gateway's own by the flows)."""

    identity: str  # what screened: the filters' versions and settings, recorded in the report

    def blocked(self, messages: Messages) -> str | None:
        """The endpoint's answer to a prompt its pre-filter blocks (the model never sees it); None when it passes."""
        ...

    def served(self, reply: str) -> str:
        """``reply`` as the endpoint sends it: the same text, or what its post-filter released and its stop text."""
        ...


class ScreenedChat:
    """``model`` behind ``screen``: what a client of the endpoint would get. Counts what the screen did."""

    def __init__(self, model: ChatModel, screen: Screen) -> None:
        self.model = model
        self.screen = screen
        self.blocked = 0  # prompts answered by the pre-filter
        self.stopped = 0  # replies the post-filter changed
        self.seen = 0

    def chat(self, conversations: Sequence[Messages], sampling: Sampling, seeds: Sequence[int]) -> list[list[str]]:
        answers = [self.screen.blocked(c) for c in conversations]
        passed = [i for i, a in enumerate(answers) if a is None]
        replies = (
            self.model.chat([conversations[i] for i in passed], sampling, [seeds[i] for i in passed]) if passed else []
        )
        out: list[list[str]] = [[a] * sampling.n if a is not None else [] for a in answers]
        for i, texts in zip(passed, replies, strict=True):
            served = [self.screen.served(t) for t in texts]
            self.stopped += sum(a != b for a, b in zip(texts, served, strict=True))
            out[i] = served
        self.seen += len(conversations)
        self.blocked += len(conversations) - len(passed)
        return out

    def counts(self) -> dict[str, int]:
        return {"asked": self.seen, "blocked": self.blocked, "stopped": self.stopped}
