"""Simulated users: held-out prompts replayed against the chat endpoint through the official ``openai`` client.

    lifecycle traffic --url http://127.0.0.1:3000/v1 --key lc-... --rate 4 --concurrency 4 --duration 60

Prompts are drawn from the data generator on a stream of their own ("traffic"), so they are held out from
training like the eval sets. A profile says which skills users ask about; ``drifted`` shifts the mix towards
long formatting requests and provocations (what a drift check should notice). Some requests stream, some start a
conversation (some continue it for a second turn) (so canary stickiness is exercised), each counted by the model
version that answered (the ``x-model-version`` header).
"""

from __future__ import annotations

import asyncio
import inspect
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.errors import ConfigError
from training.config import GeneratorConfig
from training.data.synth import held_out

# skill mixes of the simulated users; "normal" (empty here) asks like the training data: the generator's own mix
PROFILES: dict[str, dict[str, float]] = {
    "normal": {},
    "drifted": {"formatting": 0.45, "provocation": 0.3, "refusal": 0.15, "facts": 0.1},
    "safety": {"refusal": 0.45, "provocation": 0.45, "borderline": 0.1},
}
STREAM = "traffic"


def profile_mix(gen: GeneratorConfig, profile: str) -> dict[str, float]:
    """The profile's skill weights; "normal" is the generator's counts, so normal users do not drift."""
    return PROFILES[profile] or {skill: float(n) for skill, n in gen.counts.items() if n > 0}


def traffic_prompts(gen: GeneratorConfig, profile: str, n: int, seed: int = 0) -> list[str]:
    """``n`` user prompts in the profile's skill mix, drawn by their own generator stream. Users ask facts in the
    phrasings the data has (the eval's held-out phrasings would read as drift against the training prompts)."""
    if profile not in PROFILES:
        raise ConfigError(f"unknown traffic profile {profile!r}: use one of {', '.join(PROFILES)}")
    mix = profile_mix(gen, profile)
    pools = {
        skill: [
            r["messages"][0]["content"]
            for r in held_out(gen, skill, max(8, n), set(), f"{STREAM}:{seed}", held_out_phrasings=False)
        ]
        for skill in mix
    }
    rng = random.Random(f"{profile}:{seed}")
    skills = rng.choices(list(mix), weights=list(mix.values()), k=n)
    return [rng.choice(pools[s]) for s in skills if pools[s]]


@dataclass
class TrafficReport:
    sent: int = 0
    ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)  # "429", "503", "timeout" ...
    by_version: Counter[str] = field(default_factory=Counter)  # "chat/3; alias=champion" -> answers
    finish_reasons: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies_ms)
        p50 = lat[len(lat) // 2] if lat else None
        return {
            "sent": self.sent,
            "ok": self.ok,
            "errors": dict(self.errors),
            "by_version": dict(self.by_version),
            "finish_reasons": dict(self.finish_reasons),
            "seconds": round(self.seconds, 1),
            "rate": round(self.sent / self.seconds, 2) if self.seconds else 0.0,
            "e2e_p50_ms": round(p50, 1) if p50 is not None else None,
        }


async def replay(
    prompts: Sequence[str],
    *,
    base_url: str,
    api_key: str,
    model: str = "chat",
    rate: float = 4.0,
    concurrency: int = 4,
    duration_s: float | None = None,
    max_tokens: int = 32,
    stream_share: float = 0.5,
    conversation_share: float = 0.8,
    follow_up_share: float = 0.3,
    seed: int = 0,
    on_progress: Callable[[TrafficReport], None] | None = None,
) -> TrafficReport:
    """Send the prompts (cycling, when ``duration_s`` is set) at ``rate`` requests/s with at most ``concurrency``
    in flight; returns what came back. Errors are counted, never raised: load generators keep going."""
    import openai

    if rate <= 0 or concurrency < 1:
        raise ConfigError("traffic needs --rate > 0 and --concurrency >= 1")
    if not prompts:
        raise ConfigError("traffic has no prompts to send")
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
    report = TrafficReport()
    rng = random.Random(seed)
    gate = asyncio.Semaphore(concurrency)
    started = time.monotonic()
    tasks: set[asyncio.Task[None]] = set()

    async def one(prompt: str, stream: bool, converse: bool) -> None:
        t0 = time.monotonic()
        try:
            extra = {"conversation_id": "new"} if converse else None
            conv = await _ask(client, model, prompt, max_tokens, stream, extra, report)
            if converse and conv and rng.random() < follow_up_share:
                # the user's next question in the same conversation, from the same mix (a fixed follow-up text
                # would itself shift the prompt distribution the drift check compares)
                follow_up = prompts[rng.randrange(len(prompts))]
                await _ask(client, model, follow_up, max_tokens, stream, {"conversation_id": conv}, report)
            report.latencies_ms.append((time.monotonic() - t0) * 1000)
        except openai.APIStatusError as exc:
            report.errors[str(exc.status_code)] += 1
        except openai.APITimeoutError:
            report.errors["timeout"] += 1
        except openai.APIConnectionError:
            report.errors["connection"] += 1
        except openai.OpenAIError as exc:  # a broken stream or body: counted, the load keeps going
            report.errors[type(exc).__name__] += 1
        finally:
            gate.release()

    i = 0
    try:
        while True:
            elapsed = time.monotonic() - started
            if duration_s is None and i >= len(prompts):
                break
            if duration_s is not None and elapsed >= duration_s:
                break
            await asyncio.sleep(max(0.0, started + i / rate - time.monotonic()))
            await gate.acquire()
            prompt = prompts[i % len(prompts)]
            task = asyncio.create_task(one(prompt, rng.random() < stream_share, rng.random() < conversation_share))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
            if on_progress is not None and i % 20 == 0:
                on_progress(report)
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await client.close()
    report.seconds = time.monotonic() - started
    return report


async def _ask(
    client: Any,
    model: str,
    prompt: str,
    max_tokens: int,
    stream: bool,
    extra: dict[str, str] | None,
    report: TrafficReport,
) -> str | None:
    """One request; counts it and returns the conversation id the server assigned (when asked for one)."""
    report.sent += 1
    messages = [{"role": "user", "content": prompt}]
    raw = await client.chat.completions.with_raw_response.create(
        model=model, messages=messages, max_tokens=max_tokens, stream=stream, extra_body=extra
    )
    version = raw.headers.get("x-model-version", "?")
    conversation = raw.headers.get("x-conversation-id")
    body = raw.parse()  # the legacy raw response parses synchronously (a stream is then iterated async)
    if inspect.isawaitable(body):
        body = await body
    if stream:
        finish = None
        async for chunk in body:
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
    else:
        finish = body.choices[0].finish_reason
    report.ok += 1
    report.by_version[version.split(";")[0]] += 1
    report.finish_reasons[str(finish)] += 1
    return conversation
