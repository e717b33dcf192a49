"""The context budget: fitting a conversation and its answer into the model's window.

Policy (documented in docs/serving.md, "Context budget"):
1. ``max_tokens`` defaults to ``context.default_max_tokens`` and is capped at ``context.max_tokens_cap``.
2. The prompt is the chat template over the system prompt(s) and the turns. When it does not fit with room for
   the answer, the oldest turns are dropped (never the system prompt, never the newest user turn), whole
   user-led exchanges, as few as make it fit with at least ``min(max_tokens, min_completion_tokens)`` left.
   The cut is found by bisection over the user turns (dropping more never lengthens the prompt): O(log n)
   renders of the template instead of one per dropped exchange, so a long conversation costs milliseconds.
3. If the system prompt and the newest turn alone do not fit, the request is refused (400,
   ``context_length_exceeded``) with the numbers.
4. The answer gets what is left of the window, up to ``max_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from serving.config import ContextConfig
from serving.engines.engine import Engine, Tokenizer
from serving.wire.errors import bad_request, invalid
from serving.wire.protocol import SamplingRequest


@dataclass(frozen=True)
class FittedPrompt:
    token_ids: list[int]
    max_tokens: int
    dropped_messages: int


def render(tokenizer: Tokenizer, messages: list[dict[str, str]]) -> list[int]:
    ids: Any = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def fit(
    tokenizer: Tokenizer,
    messages: list[dict[str, str]],
    window: int,
    requested_max_tokens: int | None,
    cfg: ContextConfig,
) -> FittedPrompt:
    max_tokens = min(requested_max_tokens or cfg.default_max_tokens, cfg.max_tokens_cap)
    reserve = min(max_tokens, cfg.min_completion_tokens)
    system = [m for m in messages if m["role"] == "system"]
    turns = [m for m in messages if m["role"] != "system"]

    def fitted(cut: int) -> FittedPrompt | None:
        ids = render(tokenizer, system + turns[cut:])
        return FittedPrompt(ids, min(max_tokens, window - len(ids)), cut) if len(ids) + reserve <= window else None

    whole = fitted(0)
    if whole is not None:
        return whole
    cuts = _cuts(turns)  # where the kept part may start: each user turn after the first, up to the newest
    best: FittedPrompt | None = None
    low, high = 0, len(cuts) - 1
    while low <= high:  # the first cut that fits
        mid = (low + high) // 2
        found = fitted(cuts[mid])
        if found is not None:
            best, high = found, mid - 1
        else:
            low = mid + 1
    if best is not None:
        return best
    ids = render(tokenizer, system + turns[cuts[-1] if cuts else 0 :])
    raise bad_request(
        f"This model's maximum context length is {window} tokens. The system prompt and the newest "
        f"message take {len(ids)} tokens, and at least {reserve} must be left for the completion "
        f"({len(ids) + reserve} > {window}). Shorten the message.",
        code="context_length_exceeded",
        param="messages",
    )


def _cuts(turns: list[dict[str, str]]) -> list[int]:
    """Indices of the user turns after the first one, up to the newest user turn: the places a trimmed
    conversation may start (never past the newest user turn)."""
    users = [i for i, m in enumerate(turns) if m["role"] == "user"]
    return [i for i in users if i > 0]


def check_vocabulary(req: SamplingRequest, engine: Engine) -> None:
    """``logit_bias`` names tokens of the served model's vocabulary (an unknown id would fail in the engine)."""
    unknown = sorted(t for t in req.bias_ids() if t >= engine.vocab_size)
    if unknown:
        raise invalid(
            f"logit_bias names token id(s) {unknown[:5]} outside this model's vocabulary of {engine.vocab_size} tokens",
            param="logit_bias",
        )
