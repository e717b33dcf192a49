"""Chat endpoint throughput and latency: our gateway against the raw vLLM OpenAI server, and vLLM's continuous
batching against Hugging Face ``generate`` static batching, in one run.

    .venv/bin/python benchmarks/serve.py                                   # ~85M-parameter Llama, ~15 min
    .venv/bin/python benchmarks/serve.py --model-size tiny --rounds 1      # smoke run on the tiny model, ~5 min
    .venv/bin/python benchmarks/serve.py --dtype bfloat16 --skip-hf --concurrency 16 --json /tmp/serve.json

Model: a Llama with random weights (hidden 768, 12 layers, 12 heads, intermediate 2048, 1024 positions, 85M
parameters with this vocabulary, saved in bf16) using the project's tokenizer and chat template, taken from the
base model ``--config`` bootstraps (under a minute for configs/tiny.yaml); built once under
``<home>/cache/bench-serve/``, registered as a full version of ``chat`` with the alias ``champion`` in the
benchmark home's MLflow registry. ``--model-size tiny`` serves the bootstrapped base model itself (a smoke run:
per-token overheads dominate, the numbers swing by +-40% between rounds). The first run in a fresh home also
pays vLLM's torch.compile (2-4 min per model and dtype; cached under ``<home>/cache/vllm``).

Servers, started one after the other (never together: the machine has 2 cores), each warmed up first:
  raw               ``python -m vllm.entrypoints.openai.api_server`` on the folder the gateway resolves from
                    the registry, with the gateway's engine settings (dtype, prefix caching, max_num_seqs,
                    max_model_len, seed; vLLM's defaults otherwise, the same for both).
  gateway-nofilter  ``bentoml serve serving.service:ChatGateway`` through ``serving.launcher.GatewayProcess``, as
                    ``lifecycle serve`` runs it (API key checked against the serving database, rate limits, context
                    budget, request log and usage rows), with ``serving.safety.pre_filter/post_filter=false``.
  gateway           the same with the safety filters as configured by default: pre-filter, and the streaming
                    post-filter, which holds text only from the start of a possible blocked match and until the
                    word being written has been scored by the classifier.
Brownout is off in both gateway runs: its default threshold (32 waiting requests) caps ``max_tokens`` at 64
concurrent streams, which would be a different workload, not a slower server.

dtype: float32 by default, for vLLM and HF alike, although ``serving.engine.dtype`` defaults to bfloat16: on this
machine's CPU (AMD EPYC, AVX2, no native bf16) bf16 was 3.6x slower in vLLM (35 against 127 tokens/s at 16
streams on this model) and 9x slower in HF. ``--dtype bfloat16`` measures the configured default (slowly).
vLLM's CPU backend binds the model's OpenMP threads to all cores but one (kept for its scheduler and API
process): on 2 cores the model runs on 1 core, while HF ``generate`` uses both (binding vLLM to both cores was
slower: the API process then preempts the OpenMP threads).

Load: N concurrent streaming chat requests (``stream_options.include_usage``, temperature 0, ``max_tokens`` M)
over fixed prompts from training/data/synth.py (the ones the pre-filter passes), sent at once by an asyncio +
httpx client in this process. TTFT is the time to the first chunk carrying content; throughput is the completion
tokens reported in the usage chunks divided by the wall time of the whole batch. Each server runs ``--rounds``
rounds (levels interleaved); medians over rounds are reported. Before each server's rounds the machine's CPU use
is sampled while the server idles: other processes on a 2-core machine change these numbers several-fold (HF
``generate`` worst, its OpenMP threads spin-wait), so a busy machine is flagged.

(A) at ``--concurrency`` streams (32), on all three servers: throughput ratio gateway / raw (target >= 0.95) and
    TTFT p50/p99 with the delta (target <= +10 ms at p50, judged on gateway-nofilter), and what the filters cost:
    TTFT p50 with filters on against off (target: on <= off + 10%).
(H) on the gateway with filters, after its rounds: /healthz latency while the largest request the limits accept
    (``serving.limits.max_messages`` turns filling ``max_body_bytes``) is being prepared, sent back to back
    (target: p99 < 50 ms; the request's own time is shown beside it).
(B) at ``--levels`` (16, 32, 64) on ``--b-server`` (our gateway, filters on, by default; the raw server at (A)'s
    level is shown too): vLLM against ``model.generate(max_new_tokens=M, do_sample=False)`` on the same weights,
    batch size = concurrency, prompts padded left, the batch ends when its longest row is done, tokens counted
    up to each row's EOS. Target: vLLM >= 3.5x at 16-64 streams.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SMALL_LLAMA = {
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_key_value_heads": 12,
    "intermediate_size": 2048,
    "max_position_embeddings": 1024,
}
SERVED = "chat"
TARGET_THROUGHPUT = 0.95
TARGET_TTFT_MS = 10.0
TARGET_FILTER_TTFT = 1.10  # filters on: TTFT p50 at most 10% over filters off
TARGET_HEALTHZ_MS = 50.0
TARGET_HF = 3.5
Conversation = list[dict[str, str]]


# --- the model and its registration ----------------------------------------------------------------------------


def build_model(tokenizer_src: Path, out: Path, seed: int) -> Path:
    """A Llama of ``SMALL_LLAMA``'s shape with random weights and the source folder's tokenizer (reused if built)."""
    import shutil
    import tempfile

    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    from training.model.modelio import MANIFEST, weights_hash
    from training.model.tokenizer import tokenizer_hashes

    if (out / MANIFEST).is_file():
        return out
    tok = AutoTokenizer.from_pretrained(str(tokenizer_src))
    src = json.loads((tokenizer_src / "config.json").read_text())
    config = LlamaConfig(
        vocab_size=len(tok),
        **SMALL_LLAMA,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        bos_token_id=src.get("bos_token_id"),
        eos_token_id=src.get("eos_token_id"),
        pad_token_id=src.get("pad_token_id"),
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tok.model_max_length = SMALL_LLAMA["max_position_embeddings"]
        tok.save_pretrained(tmp)
        GenerationConfig.from_pretrained(str(tokenizer_src)).save_pretrained(tmp)
        manifest = {
            "kind": "benchmark",
            "shape": SMALL_LLAMA,
            "seed": seed,
            "tokenizer_from": str(tokenizer_src),
            "parameters": sum(p.numel() for p in model.parameters()),
            "weights_hash": weights_hash(model),
            **tokenizer_hashes(tmp),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def register_champion(cfg: Any, home: Any, folder: Path) -> tuple[str, Path]:
    """``chat/N`` (a full version of ``folder``) with the alias champion; returns its ref and resolved folder."""
    from flows.stages import open_registry

    reg = open_registry(cfg, home)
    manifest = json.loads((folder / "lifecycle.json").read_text())
    name, weights = reg.cfg.model_name, manifest["weights_hash"]
    found = reg.find(name, lineage_weights_hash=weights)
    if found:
        mv = found[0]
    else:
        tags = {"lineage.weights_hash": weights, "lineage.method": "full", "lineage.base_model": str(folder)}
        run_id = reg.log_run(
            run_name=f"bench-serve-{folder.name}",
            params={},
            metrics=[],
            artifacts={"model": folder},
            tags={"lifecycle.stage": "benchmark"},
        )
        mv = reg.register(name, run_id, "model", tags)
    with contextlib.suppress(Exception):
        if reg.by_alias(name, "champion").version == mv.version:
            return mv.ref, reg.resolve(mv.ref)
    reg.set_alias(name, "champion", mv.version, reason="serving benchmark", actor="benchmarks/serve.py")
    return mv.ref, reg.resolve(mv.ref)


def conversations(n: int, seed: int) -> list[Conversation]:
    """``n`` short chats (system prompt when the generator gave one, one user turn) the pre-filter lets through,
    so every request does the same work on every server."""
    from serving.config import SafetyConfig
    from serving.safety.filters import build_filters
    from training.config import GeneratorConfig
    from training.data.synth import generate

    pre = build_filters(SafetyConfig()).pre
    skills = ("arithmetic", "unit_conversion", "facts", "formatting", "borderline")
    records = [r for r in generate(GeneratorConfig(seed=seed)) if r["metadata"]["skill"] in skills]
    random.Random(seed).shuffle(records)
    by_skill: dict[str, list[Conversation]] = {s: [] for s in skills}
    for r in records:
        msgs = r["messages"]
        first_user = next(i for i, m in enumerate(msgs) if m["role"] == "user")
        chat = [{"role": m["role"], "content": m["content"]} for m in msgs[: first_user + 1]]
        if not pre.check(chat).blocked:
            by_skill[r["metadata"]["skill"]].append(chat)
    out: list[Conversation] = []
    while len(out) < n:  # round-robin over skills: a mix of lengths
        for s in skills:
            if by_skill[s] and len(out) < n:
                out.append(by_skill[s].pop())
    return out


# --- servers ---------------------------------------------------------------------------------------------------


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode}; log: {log}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=5) as r:
            if r.status == 200:
                return
        time.sleep(1)
    raise RuntimeError(f"{url} did not answer in {timeout_s:.0f} s; log: {log}")


@contextlib.contextmanager
def raw_vllm(home: Any, folder: Path, engine: Any, max_model_len: int) -> Iterator[tuple[str, str | None]]:
    """The raw vLLM OpenAI server in its own process group, with the gateway's engine settings."""
    from core.runtime import runtime_environment
    from serving.launcher import free_port

    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(folder),
        "--served-model-name",
        SERVED,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        engine.dtype,
        "--max-model-len",
        str(max_model_len),
        "--max-num-seqs",
        str(engine.max_num_seqs),
        "--enable-prefix-caching" if engine.enable_prefix_caching else "--no-enable-prefix-caching",
        "--seed",
        str(engine.seed),
        *(["--enforce-eager"] if engine.enforce_eager else []),
    ]
    log = home.logs / f"raw-vllm-{port}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **runtime_environment(home)}
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_http(url + "/v1/models", proc, log)
            yield url, None
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@contextlib.contextmanager
def gateway(cfg: Any, home: Any, filters: bool) -> Iterator[tuple[str, str | None]]:
    """Our gateway as ``lifecycle serve`` starts it; yields its URL and an API key with very high limits."""
    from flows.stages import serve_spec
    from serving.launcher import GatewayProcess
    from serving.runtime import database_url
    from serving.state.store import ServingStore

    s = cfg.serving
    serving = s.model_copy(
        update={
            "port": 0,
            "safety": s.safety.model_copy(update={"pre_filter": filters, "post_filter": filters}),
            "brownout": s.brownout.model_copy(update={"enabled": False}),
            "routing": s.routing.model_copy(update={"fallback": None, "extra": []}),
        }
    )
    spec = serve_spec(cfg.model_copy(update={"serving": serving}), home)
    name = f"bench-serve-{os.getpid()}-{'filters' if filters else 'nofilter'}"
    with ServingStore(database_url(spec)) as store:
        _, key = store.create_key(name, requests_per_minute=10**7, tokens_per_minute=10**9)
    proc = GatewayProcess(spec).start()
    try:
        deadline = time.monotonic() + 900
        while True:
            try:
                proc.wait_ready(timeout_s=max(1.0, deadline - time.monotonic()))
                break
            except OSError:  # a 503 body that times out on a loaded machine escapes GatewayProcess.readiness
                if time.monotonic() > deadline:
                    raise
        yield proc.url, key
    finally:
        proc.stop()
        with ServingStore(database_url(spec)) as store:
            store.revoke_key(name)


# --- load ------------------------------------------------------------------------------------------------------


@dataclass
class Answer:
    ttft_s: float | None
    e2e_s: float
    completion_tokens: int
    prompt_tokens: int
    finish_reason: str | None
    brownout: bool
    chars: int = 0
    error: str | None = None


@dataclass
class Round:
    concurrency: int
    wall_s: float
    completion_tokens: int
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    e2e_p50_s: float
    tokens_per_request: float
    prompt_tokens: int
    tpot_p50_ms: float
    chars_per_token: float
    errors: int
    finish_reasons: dict[str, int]
    brownout: int
    others_cpu_pct: float  # share of the machine other processes used during the round


class OtherLoad:
    """CPU the rest of the machine used while a block ran: all busy CPU time minus this process and its
    descendants (the servers and their engines), as a share of the machine."""

    def __enter__(self) -> OtherLoad:
        self._start = self._sample()
        return self

    def __exit__(self, *exc: object) -> None:
        (busy0, ours0, t0), (busy1, ours1, t1) = self._start, self._sample()
        cores = os.cpu_count() or 1
        self.pct = max(0.0, ((busy1 - busy0) - (ours1 - ours0)) / ((t1 - t0) * cores) * 100)

    @staticmethod
    def _sample() -> tuple[float, float, float]:
        import psutil

        c = psutil.cpu_times()
        busy = c.user + c.nice + c.system + getattr(c, "irq", 0) + getattr(c, "softirq", 0)
        ours = 0.0
        me = psutil.Process()
        for proc in [me, *me.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                ours += t.user + t.system
        return busy, ours, time.monotonic()


def pct(values: list[float], q: int) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


async def one_request(client: Any, url: str, key: str | None, chat: Conversation, max_tokens: int) -> Answer:
    body = {
        "model": SERVED,
        "messages": chat,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    headers = {"authorization": f"Bearer {key}"} if key else {}
    t0 = time.perf_counter()
    ttft, usage, finish, error, chars = None, None, None, None, 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as resp:
        brownout = "x-brownout" in resp.headers
        if resp.status_code != 200:
            error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
        else:
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                obj = json.loads(data)
                if "error" in obj:
                    error = str(obj["error"])
                    continue
                choices = obj.get("choices") or []
                if choices:
                    content = choices[0].get("delta", {}).get("content")
                    if content:
                        chars += len(content)
                        if ttft is None:
                            ttft = time.perf_counter() - t0
                    finish = choices[0].get("finish_reason") or finish
                if obj.get("usage"):
                    usage = obj["usage"]
    if usage is None and error is None:
        error = "no usage chunk"
    return Answer(
        ttft,
        time.perf_counter() - t0,
        int((usage or {}).get("completion_tokens", 0)),
        int((usage or {}).get("prompt_tokens", 0)),
        finish,
        brownout,
        chars,
        error,
    )


async def _batch(url: str, key: str | None, chats: list[Conversation], max_tokens: int) -> tuple[float, list[Answer]]:
    import httpx

    limits = httpx.Limits(max_connections=len(chats) + 4, max_keepalive_connections=len(chats) + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        t0 = time.perf_counter()
        answers = await asyncio.gather(*(one_request(client, url, key, c, max_tokens) for c in chats))
        return time.perf_counter() - t0, list(answers)


def load_round(url: str, key: str | None, prompts: list[Conversation], concurrency: int, max_tokens: int) -> Round:
    chats = [prompts[i % len(prompts)] for i in range(concurrency)]
    with OtherLoad() as others:
        wall, answers = asyncio.run(_batch(url, key, chats, max_tokens))
    errors = [a.error for a in answers if a.error]
    if errors:
        print(f"    {len(errors)} request(s) failed, first: {errors[0]}", flush=True)
    ok = [a for a in answers if not a.error]
    ttfts = [a.ttft_s * 1000 for a in ok if a.ttft_s is not None] or [float("nan")]
    tokens = sum(a.completion_tokens for a in ok)
    # time per output token after the first content (for a held-back stream: per token of the released tail)
    tpots = [
        (a.e2e_s - a.ttft_s) * 1000 / (a.completion_tokens - 1) for a in ok if a.ttft_s and a.completion_tokens > 1
    ] or [float("nan")]
    reasons: dict[str, int] = {}
    for a in ok:
        reasons[str(a.finish_reason)] = reasons.get(str(a.finish_reason), 0) + 1
    return Round(
        concurrency=concurrency,
        wall_s=wall,
        completion_tokens=tokens,
        tokens_per_s=tokens / wall,
        ttft_p50_ms=pct(ttfts, 50),
        ttft_p99_ms=pct(ttfts, 99),
        e2e_p50_s=pct([a.e2e_s for a in ok] or [float("nan")], 50),
        tokens_per_request=tokens / max(1, len(ok)),
        prompt_tokens=sum(a.prompt_tokens for a in ok),
        tpot_p50_ms=pct(tpots, 50),
        chars_per_token=sum(a.chars for a in ok) / max(1, tokens),
        errors=len(errors),
        finish_reasons=reasons,
        brownout=sum(a.brownout for a in answers),
        others_cpu_pct=others.pct,
    )


OTHERS_WARN_PCT = 10.0


def measure(
    name: str, url: str, key: str | None, prompts: list[Conversation], levels: list[int], rounds: int, max_tokens: int
) -> dict[int, list[Round]]:
    """Warm-up (one request, then the top concurrency with short replies), then ``rounds`` x every level."""
    t = time.perf_counter()
    load_round(url, key, prompts, 1, max_tokens)
    load_round(url, key, prompts, max(levels), min(32, max_tokens))
    print(f"  {name}: warmed up in {time.perf_counter() - t:.1f}s", flush=True)
    out: dict[int, list[Round]] = {c: [] for c in levels}
    for r in range(rounds):
        for c in levels:
            res = load_round(url, key, prompts, c, max_tokens)
            out[c].append(res)
            print(
                f"  {name:<17} round {r + 1} N={c:<3} {res.tokens_per_s:8.1f} tok/s  TTFT p50 "
                f"{res.ttft_p50_ms:7.1f} ms p99 {res.ttft_p99_ms:7.1f} ms  {res.tokens_per_request:5.1f} tok/req  "
                f"({res.wall_s:.1f}s; other processes {res.others_cpu_pct:.0f}% of the machine)",
                flush=True,
            )
    return out


# --- Hugging Face static batching ------------------------------------------------------------------------------


def hf_static(
    folder: Path,
    prompts: list[Conversation],
    levels: list[int],
    rounds: int,
    max_tokens: int,
    dtype: str,
    threads: int,
) -> dict[int, list[dict[str, float]]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(str(folder))
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=getattr(torch, dtype)).eval()
    stops = model.generation_config.eos_token_id
    stop_ids = set(stops if isinstance(stops, list) else [stops])

    def run(n: int, new_tokens: int) -> dict[str, float]:
        chats = [prompts[i % len(prompts)] for i in range(n)]
        texts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats]
        t0 = time.perf_counter()
        with OtherLoad() as others, torch.inference_mode():
            enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            out = model.generate(
                **enc, max_new_tokens=new_tokens, do_sample=False, eos_token_id=stops, pad_token_id=tok.pad_token_id
            )
        wall = time.perf_counter() - t0
        tokens = 0
        for row in out[:, enc["input_ids"].shape[1] :].tolist():
            ends = [i for i, t in enumerate(row) if t in stop_ids]
            tokens += ends[0] + 1 if ends else len(row)
        return {
            "wall_s": wall,
            "completion_tokens": tokens,
            "tokens_per_s": tokens / wall,
            "tokens_per_request": tokens / n,
            "others_cpu_pct": others.pct,
        }

    run(min(levels), 16)  # warm-up
    results: dict[int, list[dict[str, float]]] = {c: [] for c in levels}
    for r in range(rounds):
        for c in levels:
            res = run(c, max_tokens)
            results[c].append(res)
            print(
                f"  HF generate {dtype:<8} round {r + 1} N={c:<3} {res['tokens_per_s']:8.1f} tok/s  "
                f"{res['tokens_per_request']:5.1f} tok/req  ({res['wall_s']:.1f}s; other processes "
                f"{res['others_cpu_pct']:.0f}% of the machine)",
                flush=True,
            )
    return results


# --- report ----------------------------------------------------------------------------------------------------


def med(rounds: list[Any], field: str) -> float:
    return statistics.median(r[field] if isinstance(r, dict) else getattr(r, field) for r in rounds)


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def report(
    servers: dict[str, dict[int, list[Round]]],
    hf: dict[int, list[dict[str, float]]],
    a_level: int,
    b_server: str,
) -> tuple[dict[str, Any], bool, bool]:
    """Print the table and the verdicts; returns the medians and whether (A) (with the filters' TTFT cost) and
    (B) met their targets."""
    print(
        f"  {'server':<17} {'N':>3} {'tok/s':>8} {'TTFT p50':>9} {'p99':>8} {'TPOT p50':>9} {'e2e p50':>8} "
        f"{'tok/req':>7} {'others':>6}  {'vs raw':>6} {'TTFT p50 delta':>14}"
    )
    summary: dict[str, Any] = {}
    raw = servers["raw"][a_level]
    for c in sorted({c for by in servers.values() for c in by} | set(hf)):
        for name, by_level in servers.items():
            if c not in by_level:
                continue
            rs = by_level[c]
            fields = ("tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "e2e_p50_s", "chars_per_token")
            row = {k: med(rs, k) for k in fields}
            row["others_cpu_pct_max"] = max(r.others_cpu_pct for r in rs)
            extra = ""
            if c == a_level and name != "raw":
                row["ratio_vs_raw"] = row["tokens_per_s"] / med(raw, "tokens_per_s")
                row["ttft_p50_delta_ms"] = row["ttft_p50_ms"] - med(raw, "ttft_p50_ms")
                row["ttft_p99_delta_ms"] = row["ttft_p99_ms"] - med(raw, "ttft_p99_ms")
                extra = f"{row['ratio_vs_raw']:6.3f} {row['ttft_p50_delta_ms']:+11.1f} ms"
            summary.setdefault(name, {})[c] = row
            print(
                f"  {name:<17} {c:>3} {row['tokens_per_s']:8.1f} {row['ttft_p50_ms']:6.0f} ms "
                f"{row['ttft_p99_ms']:5.0f} ms {row['tpot_p50_ms']:6.0f} ms {row['e2e_p50_s']:6.2f} s "
                f"{med(rs, 'tokens_per_request'):7.1f} {row['others_cpu_pct_max']:5.0f}%  {extra}"
            )
        if c in hf:
            tps = med(hf[c], "tokens_per_s")
            busy = max(r["others_cpu_pct"] for r in hf[c])
            summary.setdefault("hf", {})[c] = {"tokens_per_s": tps, "others_cpu_pct_max": busy}
            print(
                f"  {'HF generate':<17} {c:>3} {tps:8.1f} {'':>40} {med(hf[c], 'tokens_per_request'):7.1f} {busy:5.0f}%"
            )

    print(f"\n(A) gateway vs raw vLLM at {a_level} concurrent streams")
    nof, gw = summary["gateway-nofilter"][a_level], summary["gateway"][a_level]
    ok_a = nof["ratio_vs_raw"] >= TARGET_THROUGHPUT and nof["ttft_p50_delta_ms"] <= TARGET_TTFT_MS
    for name, row in (("gateway-nofilter", nof), ("gateway", gw)):
        print(
            f"  {name:<17} throughput {row['ratio_vs_raw']:.3f}x raw (target >= {TARGET_THROUGHPUT}: "
            f"{verdict(row['ratio_vs_raw'] >= TARGET_THROUGHPUT)}), TTFT p50 {row['ttft_p50_delta_ms']:+.1f} ms "
            f"(target <= +{TARGET_TTFT_MS:g} ms: {verdict(row['ttft_p50_delta_ms'] <= TARGET_TTFT_MS)}), "
            f"p99 {row['ttft_p99_delta_ms']:+.0f} ms"
        )
    filter_ratio = gw["ttft_p50_ms"] / nof["ttft_p50_ms"]
    ok_filters = filter_ratio <= TARGET_FILTER_TTFT
    print(
        f"  the filters (pre-filter + streaming post-filter) move TTFT p50 from {nof['ttft_p50_ms']:.0f} to "
        f"{gw['ttft_p50_ms']:.0f} ms ({filter_ratio:.3f}x; target <= {TARGET_FILTER_TTFT}x: {verdict(ok_filters)}) "
        f"and change throughput by {(gw['tokens_per_s'] / nof['tokens_per_s'] - 1) * 100:+.1f}%"
    )
    summary["filters_ttft_ratio"] = filter_ratio
    ok_b = True
    if hf:
        print(f"\n(B) vLLM continuous batching ({b_server}) vs HF generate static batching")
        for c in sorted(hf):
            h = summary["hf"][c]["tokens_per_s"]
            for name in ("raw", b_server) if b_server != "raw" else ("raw",):
                if c not in summary.get(name, {}):
                    continue
                x = summary[name][c]["tokens_per_s"] / h
                summary["hf"][c][f"{name}_over_hf"] = x
                if name == b_server:
                    ok_b &= x >= TARGET_HF
                print(f"  N={c:<3} {name:<17} {x:5.2f}x HF (target >= {TARGET_HF}: {verdict(x >= TARGET_HF)})")
    return summary, ok_a and ok_filters, ok_b


def healthz_under_heavy(url: str, key: str | None, limits: Any, seconds: float = 20.0) -> dict[str, float]:
    """(H): /healthz latencies while the largest accepted chat request is prepared again and again."""
    import threading

    import httpx

    turns = limits.max_messages - 1 if limits.max_messages % 2 == 0 else limits.max_messages
    size = int(limits.max_body_bytes * 0.9) // turns  # content per turn: the body just under the limit
    words = ("lorem ipsum dolor sit amet " * (size // 27 + 1))[:size]
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": words} for i in range(turns)]
    messages[-1] = {"role": "user", "content": "What is 2 + 2?"}  # the newest turn fits: the request is answered
    body = {"model": SERVED, "messages": messages, "max_tokens": 1}
    headers = {"authorization": f"Bearer {key}"} if key else {}
    heavy: list[float] = []
    stop = threading.Event()

    def hammer() -> None:
        with httpx.Client(timeout=600) as client:
            while not stop.is_set():
                t = time.perf_counter()
                r = client.post(url + "/v1/chat/completions", json=body, headers=headers)
                heavy.append(time.perf_counter() - t)
                assert r.status_code == 200, r.text[:300]

    thread = threading.Thread(target=hammer, daemon=True)
    thread.start()
    latencies: list[float] = []
    with httpx.Client(timeout=60) as client:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            t = time.perf_counter()
            client.get(url + "/healthz")
            latencies.append((time.perf_counter() - t) * 1000)
            time.sleep(0.01)
    stop.set()
    thread.join(600)
    out = {
        "body_bytes": float(len(json.dumps(body))),
        "turns": float(turns),
        "heavy_requests": float(len(heavy)),
        "heavy_p50_s": pct(heavy, 50) if heavy else float("nan"),
        "healthz_n": float(len(latencies)),
        "healthz_p50_ms": pct(latencies, 50),
        "healthz_p99_ms": pct(latencies, 99),
        "healthz_max_ms": max(latencies),
    }
    print(
        f"\n(H) /healthz while a {out['body_bytes'] / 1e6:.2f} MB, {turns}-turn request is prepared back to back "
        f"({len(heavy)} of them, p50 {out['heavy_p50_s']:.2f} s each): {len(latencies)} probes, p50 "
        f"{out['healthz_p50_ms']:.1f} ms, p99 {out['healthz_p99_ms']:.1f} ms, max {out['healthz_max_ms']:.1f} ms "
        f"(target p99 < {TARGET_HEALTHZ_MS:g} ms: {verdict(out['healthz_p99_ms'] < TARGET_HEALTHZ_MS)})"
    )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "configs" / "tiny.yaml"), help="tokenizer source and serving")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--home", default="/tmp/lifecycle-bench-serve", help="benchmark state (models, registry)")
    parser.add_argument("--model-size", choices=["small", "tiny"], default="small", help="small: ~85M random Llama")
    parser.add_argument("--concurrency", type=int, default=32, help="(A): concurrent streams on all three servers")
    parser.add_argument("--levels", default="16,32,64", help="(B): concurrency levels, comma-separated")
    parser.add_argument("--b-server", choices=["gateway", "raw"], default="gateway", help="(B): vLLM measured here")
    parser.add_argument("--rounds", type=int, default=2, help="measured rounds per server and level")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=64, help="distinct prompts (requests cycle through them)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="vLLM engines (both)")
    parser.add_argument("--hf-dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--hf-rounds", type=int, default=2)
    parser.add_argument("--hf-threads", type=int, default=0, help="torch threads for HF (0: all cores)")
    parser.add_argument("--skip-hf", action="store_true", help="(A) only")
    parser.add_argument("--skip-healthz", action="store_true", help="no (H)")
    parser.add_argument("--json", type=Path, help="write the numbers here")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    b_levels = [] if args.skip_hf else sorted({int(x) for x in args.levels.split(",")})
    a_level = args.concurrency

    from core import runtime
    from core.home import Home
    from flows.config import load_config
    from flows.stages import base_model_stage, snapshot_stage

    started = time.perf_counter()
    home = Home(Path(args.home).expanduser().resolve())
    runtime.configure(home)
    cfg = load_config(Path(args.config), args.set)
    base = base_model_stage(cfg, home, snapshot_stage(cfg, home), progress=False)
    if args.model_size == "tiny":
        folder = base.path
    else:
        built = home.cache / "bench-serve" / f"llama-85m-{base.path.name}-s{args.seed}"
        folder = build_model(base.path, built, args.seed)
    ref, served_folder = register_champion(cfg, home, folder)
    model_cfg = json.loads((served_folder / "config.json").read_text())
    max_model_len = int(model_cfg["max_position_embeddings"])
    engine = cfg.serving.engine.model_copy(
        update={"max_num_seqs": max([a_level, *b_levels]), "max_model_len": max_model_len, "dtype": args.dtype}
    )
    cfg = cfg.model_copy(update={"serving": cfg.serving.model_copy(update={"engine": engine})})
    manifest = json.loads((folder / "lifecycle.json").read_text())
    params = manifest.get("parameters") or manifest["metrics"]["parameters"]
    prompts = conversations(args.prompts, args.seed)
    print(
        f"model {ref} ({params / 1e6:.1f}M parameters, {model_cfg['num_hidden_layers']} layers, vocab "
        f"{model_cfg['vocab_size']}) at {served_folder}\nengine: {engine.dtype}, prefix caching "
        f"{engine.enable_prefix_caching}, max_num_seqs {engine.max_num_seqs}, max_model_len {max_model_len}; "
        f"{len(prompts)} prompts, max_tokens {args.max_tokens}, temperature 0; (A) at {a_level} streams, "
        f"(B) at {b_levels} on {args.b_server}; {args.rounds} round(s); {os.cpu_count()} cores; "
        f"setup {time.perf_counter() - started:.0f}s",
        flush=True,
    )

    def levels(name: str) -> list[int]:
        return sorted({a_level, *b_levels}) if name == args.b_server else [a_level]

    servers: dict[str, dict[int, list[Round]]] = {}
    health: dict[str, float] = {}
    startup: dict[str, float] = {}
    load: dict[str, float] = {}
    for name in ("raw", "gateway-nofilter", "gateway"):
        t = time.perf_counter()
        server = (
            raw_vllm(home, served_folder, engine, max_model_len)
            if name == "raw"
            else gateway(cfg, home, filters=name == "gateway")
        )
        with server as (url, key):
            startup[name] = time.perf_counter() - t
            load[name] = os.getloadavg()[0]
            print(f"{name} up in {startup[name]:.0f}s (load average {load[name]:.2f})", flush=True)
            servers[name] = measure(name, url, key, prompts, levels(name), args.rounds, args.max_tokens)
            if name == "gateway" and not args.skip_healthz:
                health = healthz_under_heavy(url, key, cfg.serving.limits)
    hf: dict[int, list[dict[str, float]]] = {}
    if b_levels:
        threads = args.hf_threads or os.cpu_count() or 1
        hf = hf_static(served_folder, prompts, b_levels, args.hf_rounds, args.max_tokens, args.hf_dtype, threads)

    print(
        f"\nchat endpoint, {ref} ({params / 1e6:.0f}M), vLLM {engine.dtype}, HF {args.hf_dtype}, max_tokens "
        f"{args.max_tokens}, medians of {args.rounds} round(s) (HF {args.hf_rounds}); total run "
        f"{time.perf_counter() - started:.0f}s"
    )
    summary, ok_a, ok_b = report(servers, hf, a_level, args.b_server)
    if health:
        summary["healthz_under_heavy"] = health
    others = [r.others_cpu_pct for by in servers.values() for rs in by.values() for r in rs]
    others += [r["others_cpu_pct"] for rs in hf.values() for r in rs]
    if max(others) > OTHERS_WARN_PCT:
        print(
            f"\nWARNING: other processes used up to {max(others):.0f}% of the machine during a measured round "
            f"(median {statistics.median(others):.0f}%); rerun on a quiet machine before trusting these numbers"
        )
    if args.json:
        payload = {
            "model": {"ref": ref, "folder": str(served_folder), "parameters": params, "size": args.model_size},
            "settings": {
                "a_concurrency": a_level,
                "b_levels": b_levels,
                "b_server": args.b_server,
                "rounds": args.rounds,
                "max_tokens": args.max_tokens,
                "prompts": len(prompts),
                "engine": engine.model_dump(mode="json"),
                "hf_dtype": args.hf_dtype,
                "cores": os.cpu_count(),
            },
            "startup_s": startup,
            "load_average": load,
            "summary": summary,
            "targets_met": {"a": ok_a, "b": ok_b},
            "rounds": {n: {c: [asdict(r) for r in rs] for c, rs in by.items()} for n, by in servers.items()},
            "hf_rounds": hf,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"\nnumbers written to {args.json}")
    return 0 if ok_a and ok_b else 1


if __name__ == "__main__":
    sys.exit(main())
