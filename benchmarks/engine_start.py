"""What ``serving.engine.enforce_eager`` trades: a vLLM engine's start and its decoding speed, eager against
compiled (torch.compile with inductor, vLLM's default), on our serving engine (``serving.engines.engine.VllmEngine``,
what the gateway runs), one model, one mode at a time (2 cores).

    .venv/bin/python benchmarks/engine_start.py /path/to/model-folder
    .venv/bin/python benchmarks/engine_start.py "$(ls -d ~/.lifecycle/models/base/* | head -1)" --levels 1,8

Each mode starts in a process of its own, as a gateway's engine does: ``eager``; ``compiled, fresh cache`` (a new
``VLLM_CACHE_ROOT``: a home's first start, where inductor builds its C++ kernels); ``compiled, warm cache`` (the same
cache again: every later start in that home). Start is ``VllmEngine.start`` (its ``started_s``: engine process,
its worker, weights, KV cache, warm-up); decoding is TPOT p50 and tokens/s at each ``--levels`` of concurrent
greedy requests after one warm-up round (``benchmarks/quantized.py``'s load). Ratios are against eager.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

RESULT = "engine_start.py result: "
MODES = {"eager": (True, "own"), "compiled, fresh cache": (False, "shared"), "compiled, warm cache": (False, "shared")}


def child(folder: Path, eager: bool, levels: list[int], rounds: int, max_tokens: int) -> dict[str, Any]:
    """One engine start and its load, in this process (the parent gave it its cache folder)."""
    from benchmarks.quantized import PROMPTS, level
    from serving.config import EngineSettings
    from serving.engines.engine import VllmEngine

    settings = EngineSettings(dtype="float32", max_num_seqs=max(levels), enforce_eager=eager)
    engine = VllmEngine("full:bench", folder, settings, lora=False).start()
    try:
        tok = engine.tokenizer
        prompts = [list(tok(p)["input_ids"]) for p in PROMPTS]

        async def all_levels() -> list[dict[str, Any]]:
            return [await level(engine, prompts, n, rounds, max_tokens) for n in levels]

        return {"start_s": engine.started_s, "levels": asyncio.run(all_levels())}
    finally:
        engine.shutdown()


def run_mode(folder: Path, mode: str, cache: Path, args: argparse.Namespace) -> dict[str, Any]:
    eager, _ = MODES[mode]
    env = {**os.environ, "VLLM_CACHE_ROOT": str(cache)}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    cmd = [sys.executable, __file__, str(folder), "--child", "eager" if eager else "compiled"]
    cmd += ["--levels", args.levels, "--rounds", str(args.rounds), "--max-tokens", str(args.max_tokens)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"engine_start.py: the {mode} engine failed: {out.stderr[-2000:]}")
    (line,) = [ln for ln in out.stdout.splitlines() if ln.startswith(RESULT)]
    return {"mode": mode, **json.loads(line.removeprefix(RESULT))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path, help="a Hugging Face model folder vLLM can serve")
    parser.add_argument("--levels", default="1,8")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--child", choices=["eager", "compiled"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    levels = [int(n) for n in args.levels.split(",")]
    if args.child:
        result = child(args.model, args.child == "eager", levels, args.rounds, args.max_tokens)
        print(RESULT + json.dumps(result), flush=True)
        return 0
    if not (args.model / "config.json").is_file():
        print(f"engine_start.py: {args.model} is not a model folder (no config.json)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as own, tempfile.TemporaryDirectory() as shared:
        caches = {"own": Path(own), "shared": Path(shared)}
        results = [run_mode(args.model, mode, caches[MODES[mode][1]], args) for mode in MODES]
    from core.machine import cpu_description

    print(json.dumps({"cpu": cpu_description(), "load": os.getloadavg(), "results": results}, indent=2))
    base = results[0]
    print(
        "\n| mode | start s | ratio | "
        + " | ".join(f"{n} streams: TPOT p50 ms, tokens/s, ratio" for n in levels)
        + " |"
    )
    print("|---" * (3 + len(levels)) + "|")
    for r in results:
        cells = [
            f"{lv['tpot_p50_ms']:.1f}, {lv['tokens_per_s']:.0f}, {lv['tokens_per_s'] / b['tokens_per_s']:.2f}"
            for lv, b in zip(r["levels"], base["levels"], strict=True)
        ]
        print(
            f"| {r['mode']} | {r['start_s']:.1f} | {r['start_s'] / base['start_s']:.2f} | " + " | ".join(cells) + " |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
