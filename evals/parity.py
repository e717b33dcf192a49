"""Offline/online parity: the served engine's greedy answers against transformers' on the same prompts and chat
template, ``parity(prompts, offline, online) -> ParityReport``.

The gate measures a version through vLLM in ``evals.engine.dtype``; users get it from the gateway's vLLM engine in
``serving.engine.dtype``; fine-tuning and the export check use transformers in fp32. A precision or kernel that
changes the answers (SmolLM2-135M's greedy "capital of France" answer degenerates in bf16) changes the product, so
the three must agree where it matters: greedy decoding of the same rendered conversation. ``offline_greedy`` is
the reference (fp32 transformers, the model's own template, its generation config's end tokens); the online side
is any ``ChatModel`` (a vLLM engine in the serving precision, or the gateway's URL). An endpoint answer with
finish_reason ``content_filter`` is the gateway's safety filter, not the engine: it is listed as ``filtered`` and
left out of the comparison (``endpoint_greedy``).

    lifecycle parity chat 2                                   # a vLLM engine in serving.engine.dtype
    lifecycle parity chat 2 --url http://127.0.0.1:3000/v1 --served-model chat --api-key KEY
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from evals.generation import ChatModel, OpenAIChat, Sampling

DATA = Path(__file__).resolve().parent / "data"
# harmless prompts with short, checkable answers, and benign ones that sound risky: the answers users get most
PROMPT_FILES = (DATA / "retention.yaml", DATA / "benign_risky.yaml")


@dataclass(frozen=True)
class ParityReport:
    items: int
    equal: int
    max_tokens: int
    mismatches: list[dict[str, str]] = field(default_factory=list)  # prompt, offline, online
    filtered: list[str] = field(default_factory=list)  # prompts the endpoint's safety filter answered

    @property
    def compared(self) -> int:
        return self.items - len(self.filtered)

    @property
    def rate(self) -> float:
        """Equal answers among those the engine gave (0.0 when the filter answered every prompt)."""
        return self.equal / self.compared if self.compared else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "rate": self.rate}


def parity_prompts(n: int) -> list[str]:
    """The first ``n`` prompts of ``PROMPT_FILES``, taken from every group in turn."""
    groups = [
        [item["prompt"] if isinstance(item, dict) else item for item in items]
        for path in PROMPT_FILES
        for items in yaml.safe_load(path.read_text(encoding="utf-8")).values()
    ]
    mixed = [g[i] for i in range(max(map(len, groups))) for g in groups if i < len(g)]
    return mixed[:n]


def offline_greedy(folder: Path, prompts: Sequence[str], max_tokens: int) -> list[str]:
    """transformers' fp32 greedy reply to each prompt as a one-turn chat in the model's own template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for prompt in prompts:
            enc: Any = tok.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, return_dict=True, return_tensors="pt"
            )
            ids = model.generate(**enc, do_sample=False, max_new_tokens=max_tokens)
            out.append(str(tok.decode(ids[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)))
    return out


def online_greedy(model: ChatModel, prompts: Sequence[str], max_tokens: int) -> list[str]:
    replies = model.chat(
        [[{"role": "user", "content": p}] for p in prompts], Sampling(max_tokens=max_tokens), [0] * len(prompts)
    )
    return [r[0] for r in replies]


def endpoint_greedy(model: OpenAIChat, prompts: Sequence[str], max_tokens: int) -> tuple[list[str], list[str]]:
    """An OpenAI-compatible endpoint's greedy replies, and the prompts whose reply its safety filter gave
    (finish_reason ``content_filter``)."""
    answers = model.answers(
        [[{"role": "user", "content": p}] for p in prompts], Sampling(max_tokens=max_tokens), [0] * len(prompts)
    )
    filtered = [p for p, a in zip(prompts, answers, strict=True) if a[0][1] == "content_filter"]
    return [a[0][0] for a in answers], filtered


def parity(
    prompts: Sequence[str],
    offline: Sequence[str],
    online: Sequence[str],
    max_tokens: int,
    filtered: Sequence[str] = (),
) -> ParityReport:
    """Answers equal after surrounding whitespace (engines differ in whether they keep a leading space); the
    ``filtered`` prompts (answered by the endpoint's safety filter) are listed, not compared."""
    skip = set(filtered)
    mismatches = [
        {"prompt": p, "offline": a, "online": b}
        for p, a, b in zip(prompts, offline, online, strict=True)
        if p not in skip and a.strip() != b.strip()
    ]
    left_out = [p for p in prompts if p in skip]
    return ParityReport(len(prompts), len(prompts) - len(left_out) - len(mismatches), max_tokens, mismatches, left_out)
