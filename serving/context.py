"""The context budget: fitting a conversation and its answer into the model's window.

Policy (documented in the README):
1. ``max_tokens`` defaults to ``context.default_max_tokens`` and is capped at ``context.max_tokens_cap``.
2. The prompt is the chat template over the system prompt(s) and the turns. When it does not fit with room for
   the answer, the oldest turns are dropped (never the system prompt, never the newest user turn), one
   user-led exchange at a time, until it fits with at least ``min(max_tokens, min_completion_tokens)`` left.
3. If the system prompt and the newest turn alone do not fit, the request is refused (400,
   ``context_length_exceeded``) with the numbers.
4. The answer gets what is left of the window, up to ``max_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from serving.config import ContextConfig
from serving.engine import Tokenizer
from serving.errors import bad_request


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
    dropped = 0
    while True:
        ids = render(tokenizer, system + turns)
        if len(ids) + reserve <= window:
            return FittedPrompt(ids, min(max_tokens, window - len(ids)), dropped)
        cut = _next_cut(turns)
        if cut == 0:
            raise bad_request(
                f"This model's maximum context length is {window} tokens. The system prompt and the newest "
                f"message take {len(ids)} tokens, and at least {reserve} must be left for the completion "
                f"({len(ids) + reserve} > {window}). Shorten the message.",
                code="context_length_exceeded",
                param="messages",
            )
        turns = turns[cut:]
        dropped += cut


def _next_cut(turns: list[dict[str, str]]) -> int:
    """How many of the oldest turns to drop so the rest starts at the next user turn (0: nothing left to drop
    without losing the newest user turn)."""
    last_user = max((i for i, m in enumerate(turns) if m["role"] == "user"), default=0)
    for i in range(1, last_user + 1):
        if turns[i]["role"] == "user":
            return i
    return 0
