"""``Call``: everything one chat-completion request accumulates on its way through the gateway
(``serving.pipeline.gateway``), from the routing decision to the text released; ``Gateway.finish`` turns it
into records."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from serving.engines.brownout import BrownoutDecision
from serving.engines.engine import TokenLogprob
from serving.engines.router import ServedModel
from serving.pipeline.shadow import ShadowRun
from serving.safety.verdict import FilterVerdict
from serving.state.store import ApiKey
from serving.wire import protocol


@dataclass
class Call:
    """Everything one request accumulates on its way through; ``Gateway.finish`` turns it into records."""

    request_id: str
    started: float
    key: ApiKey | None
    request: protocol.SamplingRequest  # a ChatCompletionRequest, or a CompletionRequest (serving.api.completions)
    served: ServedModel
    route: str  # primary | canary | canary-unavailable | fallback | brownout | brownout-fallback
    brownout: BrownoutDecision
    prompt_ids: list[int]
    max_tokens: int
    new_messages: list[dict[str, str]]  # the turns this request adds (chat); empty for text completions
    conversation_id: str | None
    prompt_text: str = ""  # what the request log keeps of the prompt: the newest user turn, or the text prompt
    context_turns: int | None = None  # chat: the messages the model answers (history + new); None: text completion
    assigned: str | None = None  # the version the routing chose (the split's champion or canary), before fallback
    new_conversation: bool = False  # conversation_id is made up front; the conversation exists once accepted
    shadow: ServedModel | None = None  # the shadow version this request may be mirrored to
    shadow_run: ShadowRun | None = None
    reserved_tokens: int = 0
    completion_tokens: int = 0
    text: list[str] = field(default_factory=list)
    first_token_at: float | None = None
    finish_reason: str | None = None
    status: str = "ok"
    pre_filter: str | None = None
    post_filter: str | None = None
    safety_classifier: str | None = None  # the classifier version that judged the prompt (serving.safety.harm_filter)
    safety_shadow_classifier: str | None = None  # during a classifier canary, the version judging in shadow
    safety_shadow_rule: str | None = None  # and what it would have done (its rule, or "passed")
    reply_digest: str | None = None  # the reply as the client got it, hashed (serving.safety.replies)
    error: str | None = None
    http_status: int = 200  # what the client was told: a stream failing after its 200 carries its error's status
    want_logprobs: int | None = None  # text completions: top candidates per generated token (None: no logprobs)
    want_prompt_logprobs: int | None = None  # text completions with echo: the same for the prompt's tokens
    json_schema: dict[str, Any] | None = None  # chat with a named or required tool choice: the reply's JSON schema
    logprobs: list[TokenLogprob] = field(default_factory=list)  # per generated token, when the request asked
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
    finished: bool = False
    busy_s: float = 0.0  # this request's share of its engine's busy time (serving.pipeline.cost)
    ended: float | None = None
    created: int = field(default_factory=lambda: int(time.time()))

    def timings(self) -> tuple[float | None, float | None, float]:
        """TTFT, TPOT and end-to-end latency in ms (the call must have ended)."""
        end = self.ended if self.ended is not None else time.monotonic()
        first = self.first_token_at
        ttft_ms = (first - self.started) * 1000 if first else None
        tpot_ms = (end - first) * 1000 / (self.completion_tokens - 1) if first and self.completion_tokens > 1 else None
        return ttft_ms, tpot_ms, (end - self.started) * 1000

    def note_classifiers(self, verdict: FilterVerdict | None) -> None:
        """The classifier version that judged the prompt, and during a classifier canary the one that judged it in
        shadow with what it would have done (``serving.safety.harm_filter``)."""
        if verdict is not None:
            self.safety_classifier = verdict.classifier
            self.safety_shadow_classifier, self.safety_shadow_rule = verdict.shadow_classifier, verdict.shadow_rule

    def headers(self) -> dict[str, str]:
        out = {"x-request-id": self.request_id, "x-model-version": self.served.header()}
        if self.brownout.active:
            out["x-brownout"] = self.brownout.header()
        if self.route.endswith("fallback"):
            out["x-fallback"] = "engine-unavailable" if self.route == "fallback" else "brownout"
        if self.conversation_id:
            out["x-conversation-id"] = self.conversation_id
        if self.safety_classifier:
            out["x-safety-classifier-version"] = self.safety_classifier
        return out
