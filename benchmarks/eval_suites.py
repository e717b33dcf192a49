"""Eval suite timing, and batched vLLM generation against one-prompt-at-a-time Hugging Face ``generate``.

    .venv/bin/python benchmarks/eval_suites.py --config configs/scenarios/normal.yaml    # trains it if needed
    .venv/bin/python benchmarks/eval_suites.py --home /tmp/demo --model chat/1

1. The whole eval (every configured suite) on one registered version, as ``lifecycle eval`` runs it: the time of
   each suite, the engine start-up, and the total. Run twice with ``--force`` semantics to show the numbers
   repeat (the second run's values must equal the first's).
2. Generation baseline: the safety suite's prompts (plain + jailbreak-wrapped, greedy, same ``max_tokens``)
   through vLLM in one batch on the engine already loaded, against ``transformers`` ``generate`` one prompt at a
   time on the same weights. Prints both times and the ratio. The HF side is the "never do this" baseline the
   suites avoid.

With no ``--model``, the configured scenario is trained first (``lifecycle train`` stages, no Prefect).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))


def hf_generate_time(folder: Path, prompts: list[str], max_tokens: int) -> tuple[float, list[str]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    model.eval()
    stops = model.generation_config.eos_token_id
    outs = []
    start = time.perf_counter()
    with torch.no_grad():
        for prompt in prompts:
            ids = tok.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
            )["input_ids"]
            gen = model.generate(ids, max_new_tokens=max_tokens, do_sample=False, eos_token_id=stops)
            outs.append(tok.decode(gen[0, ids.shape[1] :], skip_special_tokens=True))
    return time.perf_counter() - start, outs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(REPO / "configs" / "scenarios" / "normal.yaml"))
    parser.add_argument("--home", default=None, help="state folder (default: a temporary one)")
    parser.add_argument("--model", default=None, help="registered version to evaluate (default: train the config)")
    args = parser.parse_args()

    import tempfile

    from core import runtime
    from core.home import Home
    from flows import gating, stages
    from flows.config import load_config

    cfg = load_config(Path(args.config))
    home = Home(Path(args.home or tempfile.mkdtemp(prefix="bench-evals-")))
    runtime.configure(home)
    if args.model:
        ref = args.model
    else:
        from support.helpers import train_version

        t = time.perf_counter()
        ref = train_version(cfg, home, run_id="benchmark").ref
        print(f"trained {ref} in {time.perf_counter() - t:.1f}s", flush=True)

    mv = stages.open_registry(cfg, home).parse(ref)
    sets = gating.eval_sets_stage(cfg, home, mv.lineage["snapshot"])
    reports = []
    for attempt in (1, 2):
        t = time.perf_counter()
        report = gating.evaluate_stage(cfg, home, ref, sets=sets, force=True)
        total = time.perf_counter() - t
        suites = sum(s.seconds for s in report.suites)
        print(
            f"\nrun {attempt}: {ref} total {total:.1f}s "
            f"(suites {suites:.1f}s, engine start and teardown {total - suites:.1f}s)"
        )
        for s in report.suites:
            print(f"  {s.name:<14} {s.seconds:6.1f}s")
        reports.append(report)
    same = reports[0].summary() == reports[1].summary()
    print(f"rerun gives the same numbers: {same}")

    # generation baseline on the same prompts and weights
    from evals.generation import Sampling
    from evals.runner import _vllm_lm

    _, target = gating.eval_target(cfg, home, ref)
    suite = next(s for s in gating.eval_suites(cfg) if s.kind == "safety")
    prompts = [r["prompt"] for r in sets.rows("safety.jsonl")]
    with _vllm_lm(cfg.evals, target) as (_, chat):
        t = time.perf_counter()
        batched = chat.chat(
            [[{"role": "user", "content": p}] for p in prompts],
            Sampling(max_tokens=suite.max_tokens),  # type: ignore[union-attr]
            list(range(len(prompts))),
        )
        vllm_s = time.perf_counter() - t
    hf_s, hf_out = hf_generate_time(target.folder, prompts, suite.max_tokens)  # type: ignore[union-attr]
    agree = sum(a[0].strip() == b.strip() for a, b in zip(batched, hf_out, strict=True)) / len(prompts)
    print(
        f"\nsafety-suite generation, {len(prompts)} prompts, greedy: vLLM batched {vllm_s:.2f}s, "
        f"HF generate one at a time {hf_s:.2f}s -> vLLM is {hf_s / vllm_s:.1f}x faster "
        f"(identical outputs: {agree:.0%})"
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
