"""The context budget (``serving.pipeline.context.fit``) as a table: max_tokens defaults and caps, trimming whole
exchanges from the oldest while keeping every system prompt and the newest user turn, the 400 with the numbers when
even that does not fit, and max_tokens cut down to the room left in the window.

Token arithmetic of ``FakeTokenizer``: a message costs its words + 2, the generation prompt 1 more.
"""

from __future__ import annotations

from typing import Any

import pytest
from unit.serving.fakes import FakeTokenizer

from serving.config import ContextConfig
from serving.pipeline.context import fit
from serving.wire.errors import APIError

CFG = ContextConfig(default_max_tokens=8, max_tokens_cap=16, min_completion_tokens=4)


def m(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


S = m("system", "be brief")  # 4 tokens
U1 = m("user", "one two three")  # 5
A1 = m("assistant", "four five")  # 4
U2 = m("user", "six seven eight nine")  # 6
A2 = m("assistant", "ten")  # 3
U3 = m("user", "eleven twelve")  # 4
CONVERSATION = [S, U1, A1, U2, A2, U3]  # 26 + 1 generation prompt = 27


def rendered(messages: list[dict[str, str]]) -> str:
    """The template text of these messages (what the fitted ids must decode to)."""
    return FakeTokenizer().apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_token_arithmetic_of_the_fixture() -> None:
    assert FakeTokenizer.count(CONVERSATION) == 27
    assert FakeTokenizer.count([S, U2, A2, U3]) == 18
    assert FakeTokenizer.count([S, U3]) == 9


@pytest.mark.parametrize(
    ("requested", "expected"),
    [
        (None, 8),  # default_max_tokens
        (3, 3),  # below the cap: as asked
        (16, 16),  # at the cap
        (50, 16),  # capped at max_tokens_cap
    ],
)
def test_max_tokens_default_and_cap(requested: int | None, expected: int) -> None:
    fitted = fit(FakeTokenizer(), CONVERSATION, 1000, requested, CFG)
    assert fitted.max_tokens == expected
    assert fitted.dropped_messages == 0
    assert len(fitted.token_ids) == 27


@pytest.mark.parametrize(
    ("window", "requested", "kept", "max_tokens", "dropped"),
    [
        # fits with the whole answer
        (100, None, CONVERSATION, 8, 0),
        # 27 + reserve 4 = 31 fits exactly: nothing dropped, the answer gets the 4 tokens left (not 8)
        (31, None, CONVERSATION, 4, 0),
        # one token short: the oldest exchange goes (user + assistant), 18 tokens, room for 8 of 12
        (30, None, [S, U2, A2, U3], 8, 2),
        # 18 + 4 = 22 > 21: the second exchange goes too, only the system prompt and the newest turn are left
        (21, None, [S, U3], 8, 4),
        # 9 + 4 = 13 fits exactly: the answer gets 4
        (13, None, [S, U3], 4, 4),
        # a request for 2 tokens reserves only 2 (min(max_tokens, min_completion_tokens)): 27 + 2 = 29 fits
        (29, 2, CONVERSATION, 2, 0),
        # ... and at 28 the oldest exchange goes
        (28, 2, [S, U2, A2, U3], 2, 2),
    ],
)
def test_trimming_drops_oldest_exchanges_and_fits_max_tokens_to_the_room_left(
    window: int, requested: int | None, kept: list[dict[str, str]], max_tokens: int, dropped: int
) -> None:
    tok = FakeTokenizer()
    fitted = fit(tok, CONVERSATION, window, requested, CFG)
    assert tok.decode(fitted.token_ids) == rendered(kept)
    assert fitted.max_tokens == max_tokens
    assert fitted.dropped_messages == dropped
    assert len(fitted.token_ids) + fitted.max_tokens <= window


@pytest.mark.parametrize(
    ("messages", "window", "kept"),
    [
        # every system prompt is kept, wherever it was, and goes first
        ([S, U1, A1, m("system", "answer in english"), U3], 18, [S, m("system", "answer in english"), U3]),
        # a conversation that starts with an assistant turn: the first cut stops at the next user turn
        ([S, A1, U1, A2, U3], 22, [S, U1, A2, U3]),
        # a tool turn is dropped with the user turn that led to it: the rest starts at the next user turn
        ([S, U1, m("tool", "result forty two"), A1, U2, A2, U3], 22, [S, U2, A2, U3]),
        ([U1, A1, U3], 10, [U3]),  # no system prompt at all
    ],
)
def test_trimmed_prompt_keeps_system_prompts_and_starts_at_a_user_turn(
    messages: list[dict[str, str]], window: int, kept: list[dict[str, str]]
) -> None:
    tok = FakeTokenizer()
    fitted = fit(tok, messages, window, 4, CFG)
    assert tok.decode(fitted.token_ids) == rendered(kept)
    non_system = [x for x in kept if x["role"] != "system"]
    assert non_system[0]["role"] == "user"
    assert non_system[-1] == messages[-1]


@pytest.mark.parametrize(
    ("messages", "window", "requested", "prompt", "reserve"),
    [
        ([S, U1, A1, U2, A2, U3], 12, None, 9, 4),  # system + newest turn = 9, + 4 reserved = 13 > 12
        ([U3], 5, None, 5, 4),  # no system prompt: the turn alone
        ([S, m("user", " ".join(["word"] * 60))], 64, 2, 67, 2),  # one huge message, a 2-token request
    ],
)
def test_refused_with_the_numbers_when_system_and_newest_turn_do_not_fit(
    messages: list[dict[str, str]], window: int, requested: int | None, prompt: int, reserve: int
) -> None:
    with pytest.raises(APIError) as caught:
        fit(FakeTokenizer(), messages, window, requested, CFG)
    err = caught.value
    assert (err.status, err.code, err.param, err.type) == (
        400,
        "context_length_exceeded",
        "messages",
        "invalid_request_error",
    )
    assert f"maximum context length is {window} tokens" in err.message
    assert f"take {prompt} tokens" in err.message
    assert f"at least {reserve} must be left" in err.message
    assert f"({prompt + reserve} > {window})" in err.message


def test_batch_encoding_return_value_is_accepted() -> None:
    """transformers 5 returns a BatchEncoding (a mapping with input_ids) from apply_chat_template."""

    class MappingTokenizer(FakeTokenizer):
        def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
            return {"input_ids": super().apply_chat_template(conversation, **kwargs), "attention_mask": []}

    fitted = fit(MappingTokenizer(), [S, U3], 100, None, CFG)
    assert len(fitted.token_ids) == 9
    assert fitted.max_tokens == 8
