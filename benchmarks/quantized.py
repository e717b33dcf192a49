"""A quantized version against its parent, in one run: TTFT and TPOT p50/p99 and tokens/s at 1, 16 and 32
concurrent streams, and memory, each model on our serving engine (``serving.engines.engine.VllmEngine``: the
engine the gateway runs, in the dtype it picks, so the quantized one in bf16 and the parent in
``serving.engine.dtype``), one after the other (never together: 2 cores).

    .venv/bin/python benchmarks/quantized.py chat 1 --config configs/smollm2.yaml --home /tmp/quant-real-home

Load: N requests sent at once (the chat template over fixed prompts, greedy, ``--max-tokens`` each, no stop at
EOS so every request writes the same number of tokens), ``--rounds`` rounds per level after one warm-up; TTFT is
the time to the first token, TPOT the time per output token after it (per request), tokens/s the output tokens
of a round over its wall time; p50/p99 are over every request of every round. Memory: the safetensors bytes and
the engine process tree's resident set (RSS) after the run, with the KV cache space fixed by
``VLLM_CPU_KVCACHE_SPACE`` and the same for all. The parent runs in the served precision and, when that is not
bf16, in bf16 as well: the quantized kernels take bf16 activations only, so the bf16 parent separates what int8
weights buy from what bf16 buys.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PROMPTS = [
    "What is the capital of France?",
    "Give me three tips for sleeping better.",
    "Explain what a variable is in programming.",
    "Write a short poem about the sea.",
    "How do I boil an egg?",
    "What causes rain?",
    "Summarize why exercise is healthy.",
    "Name two planets and one fact about each.",
]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def rss_mb() -> float:
    import psutil

    me = psutil.Process()
    return sum(p.memory_info().rss for p in [me, *me.children(recursive=True)]) / 2**20


async def one(engine: Any, rid: str, prompt: list[int], max_tokens: int) -> tuple[float, float, int]:
    from serving.engines.engine import GenerationRequest

    start = time.perf_counter()
    first = last = 0.0
    tokens = 0
    async for delta in engine.generate(GenerationRequest(rid, prompt, max_tokens=max_tokens, temperature=0.0)):
        if delta.new_tokens:
            last = time.perf_counter()
            first = first or last
            tokens += delta.new_tokens
    tpot = (last - first) / (tokens - 1) if tokens > 1 else 0.0
    return first - start, tpot, tokens


async def level(engine: Any, prompts: list[list[int]], streams: int, rounds: int, max_tokens: int) -> dict[str, Any]:
    ttft, tpot, rates = [], [], []
    for r in range(rounds + 1):
        t0 = time.perf_counter()
        done = await asyncio.gather(
            *(one(engine, f"b{streams}-{r}-{i}", prompts[i % len(prompts)], max_tokens) for i in range(streams))
        )
        wall = time.perf_counter() - t0
        if r == 0:
            continue  # warm-up
        ttft += [d[0] for d in done]
        tpot += [d[1] for d in done]
        rates.append(sum(d[2] for d in done) / wall)
    ms = 1000.0
    return {
        "streams": streams,
        "ttft_p50_ms": pct(ttft, 0.5) * ms,
        "ttft_p99_ms": pct(ttft, 0.99) * ms,
        "tpot_p50_ms": pct(tpot, 0.5) * ms,
        "tpot_p99_ms": pct(tpot, 0.99) * ms,
        "tokens_per_s": statistics.median(rates),
    }


def measure(label: str, folder: Path, settings: Any, args: argparse.Namespace) -> dict[str, Any]:
    from serving.engines.engine import VllmEngine

    engine = VllmEngine(f"full:{label}", folder, settings, lora=False).start()
    try:
        tok = engine.tokenizer
        prompts = [
            list(
                tok.apply_chat_template(
                    [{"role": "user", "content": p}], tokenize=True, add_generation_prompt=True, return_dict=True
                )["input_ids"]
            )
            for p in PROMPTS
        ]

        async def all_levels() -> list[dict[str, Any]]:  # one event loop: vLLM's output handler lives on it
            return [
                await level(engine, prompts, n, args.rounds, args.max_tokens) for n in map(int, args.levels.split(","))
            ]

        levels = asyncio.run(all_levels())
        dtype = str(engine._llm.model_config.dtype).removeprefix("torch.")
        rss = rss_mb()
    finally:
        engine.shutdown()
    weights = sum(p.stat().st_size for p in folder.glob("*.safetensors")) / 2**20
    return {"model": label, "dtype": dtype, "weights_mb": weights, "rss_mb": rss, "levels": levels}


def table(results: list[dict[str, Any]]) -> str:
    """The quantized version (last) against its parent in each precision measured (first: the served one), each
    figure with its ratio to theirs in this run."""
    *parents, child = results
    cols = [f"{r['model']} ({r['dtype']})" for r in results]
    ratios = [f"ratio to {p['dtype']}" for p in parents]
    rows = ["| streams | metric | " + " | ".join(cols + ratios) + " |", "|---" * (2 + len(cols) + len(ratios)) + "|"]

    def line(streams: object, key: str, values: list[float], fmt: str) -> str:
        cells = [format(v, fmt) for v in values] + [f"{values[-1] / v:.2f}" for v in values[:-1]]
        return f"| {streams} | {key} | " + " | ".join(cells) + " |"

    for i, lv in enumerate(child["levels"]):
        for key in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "tokens_per_s"):
            rows.append(line(lv["streams"], key, [r["levels"][i][key] for r in results], ".1f"))
    for key in ("weights_mb", "rss_mb"):
        rows.append(line("-", key, [r[key] for r in results], ".0f"))
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name")
    parser.add_argument("version", help="the quantized version (its lineage.parent is measured beside it)")
    parser.add_argument("--config", default=str(REPO / "configs" / "smollm2.yaml"))
    parser.add_argument("--home", required=True)
    parser.add_argument("--levels", default="1,16,32")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    from core import runtime
    from core.home import Home
    from flows.config import load_config
    from flows.gating import eval_target

    home = Home(Path(args.home))
    runtime.configure(home)
    cfg = load_config(Path(args.config), [])
    from flows.stages import open_registry

    child = open_registry(cfg, home).get(args.name, args.version)
    parent_ref = child.lineage["parent"]
    served = cfg.serving.engine
    runs = [(parent_ref, served)]
    if served.dtype != "bfloat16":  # the quantized kernels run in bf16: the parent in bf16 too isolates int8's share
        runs.append((parent_ref, served.model_copy(update={"dtype": "bfloat16"})))
    runs.append((child.ref, served))
    results = [measure(ref, eval_target(cfg, home, ref)[1].folder, settings, args) for ref, settings in runs]
    from core.machine import cpu_model

    model_name = cpu_model()
    out = {"cpu": model_name, "load": os.getloadavg(), "method": child.lineage.get("method"), "results": results}
    print(json.dumps(out, indent=2))
    print(table(results))
    folder = home.reports / "gates" / f"{child.name}-{child.version}"
    if folder.is_dir():  # beside the version's gate report: accuracy there, serving cost here (a re-gate clears it)
        (folder / "serving_benchmark.json").write_text(json.dumps(out, indent=2) + "\n")
        (folder / "serving_benchmark.md").write_text(
            f"# {child.ref} against {parent_ref}: serving\n\n{model_name}, load {out['load'][0]:.1f}, "
            f"{args.max_tokens} tokens a request, {args.rounds} rounds a level\n\n{table(results)}\n"
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
