"""The running gateway as tests see it (the fixture is in tests/integration/conftest.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.home import Home
from flows.config import LifecycleConfig

BROWNOUT_MAX_TOKENS = 12


@dataclass
class Gateway:
    url: str
    api_key: str
    other_key: str
    limited_key: str
    eval_key: str
    model: str
    home: Home
    config: LifecycleConfig
    versions: dict[str, Any]
    bad_token_id: int
    bad_string: str
    benign_token_id: int
    process: Any = field(repr=False)

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def client(self, key: str | None = None, **kwargs: Any) -> Any:
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key=key or self.api_key, max_retries=0, **kwargs)

    def bad_bias(self) -> dict[str, int]:
        """A logit_bias that makes the model emit the known-bad string."""
        return {str(self.bad_token_id): 100}


def tokens(base: Path) -> tuple[int, str, int]:
    """A purely alphabetic token of 4+ characters (repeated three times: a string no reply contains, the known-bad
    string) and another such token (pushed by logit_bias it keeps a generation going to max_tokens)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(base))
    candidates = []
    for token_id in range(tok.vocab_size):
        text = tok.decode([token_id])
        if text.isalpha() and len(text) >= 4:
            candidates.append((token_id, text))
    assert candidates, "the tiny tokenizer has no 4-letter token"
    token_id, text = candidates[len(candidates) // 2]
    return token_id, text * 3, candidates[0][0]
