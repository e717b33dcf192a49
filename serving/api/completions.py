"""``POST /v1/completions``: OpenAI's legacy text completions, with ``logprobs`` and ``echo`` as vLLM's OpenAI server
offers them, so lm-eval's ``local-completions`` (loglikelihood tasks: ``echo`` + ``logprobs`` + ``max_tokens: 1``
over token-id prompts) and any OpenAI completions client run against the gateway unmodified.

    prompt: "text" | ["text", ...] | [token ids] | [[token ids], ...]      (at most limits.max_prompts)
    max_tokens (16), echo, logprobs (0..20: top candidates per token, the chosen one among them), stop, seed, ...

Semantics follow vLLM (entrypoints/openai/completion): a text prompt is tokenized with the model's special
tokens; ``max_tokens`` is capped to what the window leaves after the prompt; ``echo`` puts the prompt in front of
the completion, and with ``logprobs`` the prompt tokens' logprobs in front of the generated ones (the first prompt
token has none: ``null``); ``echo`` with ``max_tokens: 0`` scores the prompt without generating (one token is
generated and dropped, and counted). Each prompt is its own engine request and request-log row
(``<id>-<index>`` when there are several), answered in one response with a choice per prompt.

The gateway's pipeline applies as to chat: key, rate limits, routing and the traffic split, brownout and fallback,
the pre-filter on the prompt, the post-filter on the generated text. A token-id prompt is judged as the text it
decodes to without its special tokens, as a chat request is judged by its messages' contents and not by the
template's control tokens (lm-eval's prompts are chat-formatted token ids; a client sending ids has the model's
raw input anyway, while text that would become a control token is what the role-marker rule refuses). Logprobs
never leak what the post-filter withheld: a stopped completion carries no generated-token logprobs. Differences
from vLLM, each a 400 naming the field: ``stream`` with several prompts or with ``logprobs``, ``suffix``,
``best_of`` > 1, ``n`` > 1.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
from pydantic import Field, StrictBool

from serving.engines.engine import Engine, TokenLogprob
from serving.pipeline.call import Call
from serving.pipeline.context import check_vocabulary
from serving.pipeline.gateway import Gateway
from serving.safety.verdict import FilterVerdict
from serving.state.store import ApiKey
from serving.wire import responses
from serving.wire.errors import APIError, bad_request
from serving.wire.protocol import SamplingRequest, usage, validate

DEFAULT_MAX_TOKENS = 16  # OpenAI's and vLLM's default for text completions


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]] = Field(
        description="A text, a list of texts, a list of token ids, or a list of token-id lists.",
        examples=["The capital of France is"],
    )
    max_tokens: int | None = Field(DEFAULT_MAX_TOKENS, ge=0, description="0 only with echo: score the prompt.")
    echo: StrictBool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and isinstance(p[0], int):
            return [p]  # one token-id prompt
        return list(p)  # type: ignore[arg-type]

    def generated_tokens(self) -> int:
        """What the engine generates: ``max_tokens``, or 1 for echo-only scoring (then dropped)."""
        asked = DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens
        return asked or 1


def parse(gw: Gateway, raw: dict[str, Any]) -> CompletionRequest:
    req = validate(CompletionRequest, raw)
    limits = gw.cfg.limits
    req.check_sampling(limits)
    prompts = req.prompts()
    if not prompts or any(len(p) == 0 for p in prompts):
        raise bad_request("prompt must not be empty", param="prompt")
    if len(prompts) > limits.max_prompts:
        raise bad_request(f"at most {limits.max_prompts} prompts per request", param="prompt")
    if req.suffix:
        raise bad_request("suffix is not supported by this model", param="suffix")
    if req.best_of not in (None, 1):
        raise bad_request("only best_of=1 is supported", param="best_of")
    if req.max_tokens == 0 and not req.echo:
        raise bad_request("max_tokens 0 means scoring the prompt: it needs echo", param="max_tokens")
    if req.stream and len(prompts) > 1:
        raise bad_request("a streamed request takes one prompt", param="prompt")
    if req.stream and req.logprobs is not None:
        raise bad_request("logprobs are returned with non-streaming requests only", param="logprobs")
    return req


def _tokenize(gw: Gateway, engine: Engine, req: CompletionRequest) -> list[tuple[list[int], str, FilterVerdict | None]]:
    """Each prompt's token ids and text, and the pre-filter's verdict on it (in a worker thread: CPU-heavy)."""
    out = []
    for prompt in req.prompts():
        if isinstance(prompt, str):
            with gw.tokenizing:
                ids = list(engine.tokenizer.encode(prompt))
            text = judged = prompt
        else:
            unknown = sorted(t for t in prompt if not 0 <= t < engine.vocab_size)
            if unknown:
                raise APIError(
                    422,
                    f"prompt names token id(s) {unknown[:5]} outside this model's vocabulary of {engine.vocab_size}",
                    code="invalid_value",
                    param="prompt",
                )
            ids = list(prompt)
            with gw.tokenizing:
                text = engine.tokenizer.decode(ids)
                judged = engine.tokenizer.decode(ids, skip_special_tokens=True)
        verdict = gw.filters.pre.check([{"role": "user", "content": judged}]) if gw.cfg.safety.pre_filter else None
        out.append((ids, text, verdict))
    return out


async def prepare(gw: Gateway, key: ApiKey | None, req: CompletionRequest, request_id: str) -> list[Call]:
    started = time.monotonic()
    route = gw.route(req.model)
    served, route_kind, brownout, assigned = gw.selection.select(route, (key.id if key else None) or request_id, None)
    engine = served.engine
    check_vocabulary(req, engine)
    prompts = await anyio.to_thread.run_sync(_tokenize, gw, engine, req, limiter=gw.preparing)
    window = engine.max_model_len
    calls = []
    for i, (ids, text, verdict) in enumerate(prompts):
        if len(ids) >= window:
            raise bad_request(
                f"This model's maximum context length is {window} tokens; prompt {i} has {len(ids)} "
                "(at least one must be left to generate). Shorten the prompt.",
                code="context_length_exceeded",
                param="prompt",
            )
        max_tokens = min(req.generated_tokens(), gw.cfg.context.max_tokens_cap, window - len(ids))
        if brownout.active and brownout.max_tokens:
            max_tokens = min(max_tokens, brownout.max_tokens)
        call = Call(
            request_id=f"{request_id}-{i}" if len(prompts) > 1 else request_id,
            started=started,
            key=key,
            request=req,
            served=served,
            route=route_kind,
            brownout=brownout,
            prompt_ids=ids,
            max_tokens=max_tokens,
            new_messages=[],
            conversation_id=None,
            assigned=assigned,
            prompt_text=text,
            want_logprobs=req.logprobs,
            want_prompt_logprobs=req.logprobs if req.echo and req.logprobs is not None else None,
        )
        gw.refuse(call, verdict)
        calls.append(call)
    reserved: list[Call] = []
    try:
        for call in calls:
            if not call.pre_filter:
                gw.reserve(call, len(call.prompt_ids) + call.max_tokens)
                reserved.append(call)
    except APIError:
        for call in reserved:  # an all-or-nothing request: give back what its earlier prompts reserved
            gw.recorder.give_back(call)
        raise
    return calls


async def complete(gw: Gateway, req: CompletionRequest, calls: list[Call]) -> dict[str, Any]:
    """The non-streaming response: every prompt's completion, generated side by side."""
    choices: dict[int, responses.CompletionChoice] = {}

    async def one(i: int, call: Call) -> None:
        async for _ in gw.run(call):
            pass
        choices[i] = _choice(i, call, req)

    async with anyio.create_task_group() as tg:
        for i, call in enumerate(calls):
            tg.start_soon(one, i, call)
    first = calls[0]
    prompt_tokens = sum(len(c.prompt_ids) for c in calls)
    completion_tokens = sum(c.completion_tokens for c in calls)
    body = responses.Completion(
        id=first.request_id.rsplit("-", 1)[0] if len(calls) > 1 else first.request_id,
        object="text_completion",
        created=first.created,
        model=req.model,
        choices=[choices[i] for i in range(len(calls))],
        usage=usage(prompt_tokens, completion_tokens),
    )
    return responses.dump(body)


def sse(gw: Gateway, req: CompletionRequest, call: Call) -> Any:
    """One prompt streamed: an echo event first (when asked), the text as released, the finish, usage, [DONE]."""
    rid, created = call.request_id, call.created

    def event(text: str, finish: str | None = None) -> dict[str, Any]:
        choice = responses.CompletionChoice(index=0, text=text, logprobs=None, finish_reason=finish)
        body = responses.CompletionChunk(
            id=rid, object="text_completion", created=created, model=req.model, choices=[choice]
        )
        return responses.dump(body)

    async def closing() -> list[dict[str, Any]]:
        events = [event("", call.finish_reason)]
        opts = req.stream_options
        if opts is not None and opts.include_usage:
            body = responses.CompletionChunk(
                id=rid,
                object="text_completion",
                created=created,
                model=req.model,
                choices=[],
                usage=usage(len(call.prompt_ids), call.completion_tokens),
            )
            events.append(responses.dump(body))
        return events

    return gw.events(call, [event(call.prompt_text)] if req.echo else [], event, closing)


def _choice(index: int, call: Call, req: CompletionRequest) -> responses.CompletionChoice:
    generated = "".join(call.text)
    scoring_only = req.echo and req.max_tokens == 0
    text = (call.prompt_text if req.echo else "") + ("" if scoring_only else generated)
    logprobs = None
    if req.logprobs is not None:
        tokens: list[TokenLogprob | None] = []
        ids: list[int] = []
        if req.echo:
            tokens += list(call.prompt_logprobs or [None] * len(call.prompt_ids))
            ids += call.prompt_ids
        if not scoring_only and not call.post_filter and not call.pre_filter:  # never what the filter withheld
            tokens += call.logprobs
            ids += [t.token_id for t in call.logprobs]
        logprobs = _logprobs_body(call, ids, tokens)
    return responses.CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=call.finish_reason)


def _logprobs_body(call: Call, ids: list[int], tokens: list[TokenLogprob | None]) -> responses.CompletionLogprobs:
    """OpenAI's completions logprobs: per position the token's text, its logprob (null for the first prompt
    token), the top candidates, and the text offset."""
    decode = call.served.engine.tokenizer.decode
    texts: list[str] = []
    logprobs: list[float | None] = []
    top: list[dict[str, float] | None] = []
    offsets: list[int] = []
    offset = 0
    for token_id, lp in zip(ids, tokens, strict=False):
        text = decode([token_id]) if lp is None else lp.text
        texts.append(text)
        logprobs.append(None if lp is None else lp.logprob)
        top.append(None if lp is None else dict(lp.top))
        offsets.append(offset)
        offset += len(text)
    # constructed, not validated: the engine's numbers go out as they are
    return responses.CompletionLogprobs.model_construct(
        tokens=texts, token_logprobs=logprobs, top_logprobs=top, text_offset=offsets
    )
