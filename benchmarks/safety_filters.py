"""Safety filter latency: the pre-filter per request and the streaming post-filter per token, on this machine's CPU.

    .venv/bin/python benchmarks/safety_filters.py
    .venv/bin/python benchmarks/safety_filters.py --prompts 2000 --replies 200 --library-prompts 300

1. ``PreFilter.check`` on ~2000 conversations of 100 B - 3 KB of user text built from the training generator
   (training/data/synth.py): multi-turn chains of its skills, and single messages with a pasted document, whose last
   request is benign (70%), a harmful request wrapped in one of the safety suite's jailbreak templates (20%) or
   plain (10%). Prints p50/p90/p99/max, the block rate of each kind, and whether p99 <= 5 ms (the target).
   The production scorer (``CompiledProfanityScorer``, what ``build_filters`` uses) and, on a subset, the library's
   own ``ProfanityScorer`` behind the same filter, to show why the compiled one exists.
2. ``StreamFilter`` on replies of 0.5-2 KB fed as token-sized deltas (1-8 characters), with three
   ``blocked_output_patterns``: time per ``feed`` (the latency it adds to each token) p50/p99, and ``finish``.

3. With ``--classifier FOLDER`` (a trained safety classifier: ``lifecycle safety-classifier train`` writes it under
   ``$LIFECYCLE_HOME/models/runs/safety-classifier/``): the latency the classifier adds to a request at 32
   concurrent streams (each checks a prompt, then generates for ``--generate-ms`` before its next request; started
   staggered), as the gateway runs the pre-filter (``anyio.to_thread`` from the event loop, on its
   ``prepare_threads``: ``--prepare-threads``, several to compare them), against the same pre-filter without it
   (rules + toxicity scorer: the filter-off baseline) on as many threads in the same run, interleaved in rounds so
   all see the same contention; prints p50/p99 of each and their difference (targets: p50 <= 5 ms,
   p99 <= 10 ms added), the share of each kind of conversation the classifier blocks, and how many its screen
   passed without an encoder pass (``core.harm.Screen``, the cascade's first look). Twice: with each
   conversation new to the classifier (every turn embedded) and with its earlier user turns judged before (as
   the requests that brought them were: only the newest turn is embedded, ``HarmClassifier.judge_turns``). Each
   also for the requests the classifier passes on to the model alone, against filter-off on the same
   conversations: a blocked request is answered with the refusal, not after the engine. And the added p99 of each
   round on its own (each run against the filter-off run just before it), with their mean and standard error: how
   far this machine's minute-to-minute speed moves the figure, and how many standard errors the target is away.

Timings are wall-clock; nothing here touches a GPU or the network.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.toxicity import ToxicityScorer
    from serving.safety.harm_filter import ClassifiedPreFilter
    from serving.safety.verdict import FilterVerdict

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TARGET_MS = 5.0
P99_TARGET_MS = 10.0  # the classifier's added p99 (issue 26)
PATTERNS = [r"sk-live-[0-9a-z]{16,}", r"\bproject\s+nightingale\b", r"(?<![\w.])internal\.example\.com\b"]


def percentiles(values_ms: list[float]) -> dict[str, float]:
    if len(values_ms) == 1:  # --replies 1: one reply's finish (quantiles wants two points)
        return dict.fromkeys(("p50", "p90", "p99", "max"), values_ms[0])
    q = statistics.quantiles(values_ms, n=100, method="inclusive")
    return {"p50": q[49], "p90": q[89], "p99": q[98], "max": max(values_ms)}


def fmt(stats: dict[str, float], unit: str = "ms") -> str:
    return "  ".join(f"{k} {v:.3f} {unit}" for k, v in stats.items())


def build_conversations(n: int, seed: int) -> list[tuple[str, list[dict[str, str]]]]:
    """(kind, messages) with 100 B - 3 KB of user text; kind: benign, jailbreak or harmful."""
    from evals.config import SafetySuite, load_suite
    from training.config import GeneratorConfig
    from training.data.synth import generate
    from training.data.synth_pools import HARMFUL, SYSTEM_PROMPTS

    suite = load_suite("safety")
    assert isinstance(suite, SafetySuite)
    wrappers = list(suite.jailbreaks.values())
    records = generate(GeneratorConfig(seed=seed))
    benign = [r for r in records if r["metadata"]["skill"] not in ("refusal",)]
    harmful = [t.format(x=x) for _, ts, xs, _ in HARMFUL for t in ts for x in xs]
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        target = int(rng.uniform(100, 3000))
        roll = rng.random()
        kind = "benign" if roll < 0.7 else "jailbreak" if roll < 0.9 else "harmful"
        if kind == "benign":
            last = rng.choice(benign)["messages"][0]["content"]
        else:
            request = rng.choice(harmful)
            last = rng.choice(wrappers).format(prompt=request) if kind == "jailbreak" else request
        messages = [{"role": "system", "content": rng.choice(SYSTEM_PROMPTS)}]
        if rng.random() < 0.5:  # a multi-turn chat
            size = len(last)
            while size < target:
                turns = rng.choice(benign)["messages"]
                messages += turns
                size += sum(len(t["content"]) for t in turns if t["role"] == "user")
            messages.append({"role": "user", "content": last})
        else:  # one message quoting a document
            doc: list[str] = []
            while sum(map(len, doc)) < target - len(last):
                doc.append(rng.choice(benign)["messages"][-1]["content"])
            messages.append({"role": "user", "content": "Here are my notes:\n" + " ".join(doc) + "\n\n" + last})
        out.append((kind, messages))
    return out


def bench_pre(label: str, conversations: list[tuple[str, list[dict[str, str]]]], scorer: ToxicityScorer) -> float:
    from serving.config import SafetyConfig
    from serving.safety.filters import PreFilter

    flt = PreFilter(SafetyConfig(), scorer)
    for _, messages in conversations[:50]:  # warm-up: caches, first-call imports
        flt.check(messages)
    times: list[float] = []
    blocked = {"benign": 0, "jailbreak": 0, "harmful": 0}
    counts = dict(blocked)
    for kind, messages in conversations:
        start = time.perf_counter_ns()
        verdict = flt.check(messages)
        times.append((time.perf_counter_ns() - start) / 1e6)
        counts[kind] += 1
        blocked[kind] += verdict.blocked
    stats = percentiles(times)
    rates = ", ".join(f"{k} {blocked[k]}/{counts[k]}" for k in counts)
    met = "met" if stats["p99"] <= TARGET_MS else "NOT met"
    print(f"  {label:<34} {fmt(stats)}  -> p99 <= {TARGET_MS:g} ms {met}")
    print(f"  {'':<34} blocked: {rates}")
    return stats["p99"]


def bench_stream(n: int, seed: int, scorer: ToxicityScorer) -> None:
    from serving.config import SafetyConfig
    from serving.safety.filters import SafetyFilters
    from training.config import GeneratorConfig
    from training.data.synth import generate

    filters = SafetyFilters(SafetyConfig(blocked_output_patterns=PATTERNS), scorer)
    answers = [r["messages"][-1]["content"] for r in generate(GeneratorConfig(seed=seed))]
    rng = random.Random(seed)
    feeds: list[float] = []
    finishes: list[float] = []
    chars = 0
    for _ in range(n):
        target = int(rng.uniform(500, 2000))
        reply = ""
        while len(reply) < target:
            reply += rng.choice(answers) + " "
        flt = filters.stream()
        i, out = 0, []
        while i < len(reply):
            k = rng.randint(1, 8)
            delta = reply[i : i + k]
            start = time.perf_counter_ns()
            out.append(flt.feed(delta))
            feeds.append((time.perf_counter_ns() - start) / 1e6)
            i += k
        start = time.perf_counter_ns()
        out.append(flt.finish())
        finishes.append((time.perf_counter_ns() - start) / 1e6)
        chars += len(reply)
        assert flt.violation is not None or "".join(out) == reply
    per_token_us = {k: v * 1000 for k, v in percentiles(feeds).items()}
    total_ms = sum(feeds) + sum(finishes)
    print(f"  feed (added latency per token)     {fmt(per_token_us, 'us')}")
    print(f"  finish (final whole-reply check)   {fmt(percentiles(finishes))}")
    print(
        f"  {n} replies, {len(feeds)} tokens, {chars / 1024:.0f} KiB: {total_ms / len(feeds) * 1000:.1f} us per token "
        f"on average, {total_ms / n:.2f} ms per reply"
    )


def bench_classifier(
    conversations: list[tuple[str, list[dict[str, str]]]],
    folders: list[Path],
    streams: int,
    rounds: int,
    generate_ms: float,
    prepare_threads: list[int],
) -> bool:
    """Each classifier's added latency against the filter-off pre-filter, for each number of preparing threads,
    all interleaved in the same rounds."""
    import asyncio

    import anyio

    from core.harm import HarmClassifier
    from core.toxicity import CompiledProfanityScorer
    from serving.config import SafetyConfig
    from serving.safety.filters import PreFilter
    from serving.safety.harm_filter import ClassifiedPreFilter, HarmFilter
    from serving.safety.replies import ReplyLedger

    cfg = SafetyConfig()
    off = PreFilter(cfg, CompiledProfanityScorer())
    # the conversations' assistant turns stand for replies the gateway wrote, which it knows (a client's own would be
    # judged too: docs/results.md, "Assistant turns a client wrote")
    replies = ReplyLedger(cfg.reply_ledger_size)
    for _, messages in conversations:
        for m in messages:
            if m["role"] == "assistant":
                replies.remember(m["content"])
    ons: list[ClassifiedPreFilter] = []
    for folder in folders:
        harm = HarmFilter(cfg, None)
        harm.classifier = HarmClassifier.load(folder, version=str(folder))
        ons.append(ClassifiedPreFilter(off, harm, replies=replies))
        for _, messages in conversations[:50]:  # warm-up (imports, first allocations)
            ons[-1].check(messages)

    async def run(flt: PreFilter | ClassifiedPreFilter, threads: int) -> list[tuple[int, float]]:
        times: list[tuple[int, float]] = []  # (conversation, ms)
        queue = list(enumerate(conversations))
        # as the gateway prepares requests: on its own ``prepare_threads`` (0: anyio's shared pool of 40)
        limiter = anyio.CapacityLimiter(threads) if threads else None

        async def stream(offset: float) -> None:
            await asyncio.sleep(offset)
            while queue:
                i, (_, messages) = queue.pop()
                start = time.perf_counter_ns()
                await anyio.to_thread.run_sync(flt.check, messages, limiter=limiter)
                times.append((i, (time.perf_counter_ns() - start) / 1e6))
                await asyncio.sleep(generate_s)  # the stream generating its reply before its next request

        generate_s = generate_ms / 1000
        await asyncio.gather(*(stream(generate_s * i / streams) for i in range(streams)))
        return times

    def history_seen(clf: HarmClassifier) -> None:
        """Each conversation's earlier user turns judged before, as the requests that brought them were."""
        for _, messages in conversations:
            turns = [m["content"] for m in messages if m["role"] in ("user", "tool") and m["content"].strip()]
            for i in range(1, len(turns)):
                clf.judge_turns(turns[:i], cfg.context_turns)

    t_off: dict[int, list[tuple[int, float]]] = {k: [] for k in prepare_threads}
    t_on: dict[int, list[dict[str, list[tuple[int, float]]]]] = {
        k: [{"new": [], "seen": []} for _ in ons] for k in prepare_threads
    }
    # each run's p99 beside the filter-off run just before it (the same minute of this machine): one difference a
    # round, per classifier and history
    paired: dict[int, list[dict[str, list[float]]]] = {
        k: [{"new": [], "seen": []} for _ in ons] for k in prepare_threads
    }
    for r in range(rounds):  # interleaved: every setting sees the same background load, in turn first
        for threads in prepare_threads if r % 2 == 0 else prepare_threads[::-1]:
            for history in ("new", "seen"):
                off_run = asyncio.run(run(off, threads))
                t_off[threads] += off_run
                for on, times, diffs in zip(ons, t_on[threads], paired[threads], strict=True):
                    clf = on.harm.classifier
                    assert clf is not None
                    clf.forget_turns()  # "new": each conversation is new to the gateway, every turn of it embedded
                    if history == "seen":
                        history_seen(clf)
                    on_run = asyncio.run(run(on, threads))
                    times[history] += on_run
                    diffs[history].append(_p99([ms for _, ms in on_run]) - _p99([ms for _, ms in off_run]))
    verdicts = [[on.check(m) for _, m in conversations] for on in ons]
    # the conversations each classified pre-filter passes on to the model: the requests whose answer it delays (a
    # blocked one is answered with the refusal instead, without waiting for the engine)
    answered = [{i for i, v in enumerate(vs) if not v.blocked} for vs in verdicts]
    met = True
    for threads in prepare_threads:
        p_off = percentiles([ms for _, ms in t_off[threads]])
        print(f"  preparing threads: {threads or 'shared pool (anyio, 40)'}")
        print(f"  filter-off (rules + toxicity)      {fmt(p_off)}")
        for folder, times, passed, diffs in zip(folders, t_on[threads], answered, paired[threads], strict=True):
            print(f"  classifier {folder}")
            p_off_passed = percentiles([ms for i, ms in t_off[threads] if i in passed])
            for history, label in (("new", "history new to it"), ("seen", "history judged before")):
                p_on = percentiles([ms for _, ms in times[history]])
                added = _added(p_on, p_off)
                ok = added["p50"] <= 5.0 and added["p99"] <= P99_TARGET_MS
                met = met and ok
                print(f"  with the classifier, {label:22} {fmt(p_on)}")
                print(
                    f"    added                            p50 {added['p50']:.3f} ms  p99 {added['p99']:.3f} ms  -> "
                    f"p50 <= 5 ms and p99 <= 10 ms {'met' if ok else 'NOT met'}"
                )
                print(f"    {round_spread(diffs[history], P99_TARGET_MS)}")
                on_passed = _added(percentiles([ms for i, ms in times[history] if i in passed]), p_off_passed)
                print(
                    f"    added to the {len(passed)} it passes on    p50 {on_passed['p50']:.3f} ms  p99 "
                    f"{on_passed['p99']:.3f} ms  (the same conversations, filter-off)"
                )
    for vs in verdicts:
        print_blocks(conversations, vs)
    return met


def _added(p_on: dict[str, float], p_off: dict[str, float]) -> dict[str, float]:
    return {k: p_on[k] - p_off[k] for k in ("p50", "p99")}


def _p99(values_ms: list[float]) -> float:
    return percentiles(values_ms)["p99"]


def round_spread(diffs_ms: list[float], target_ms: float) -> str:
    """One line on the added p99 of each round (a run against the filter-off run just before it): their mean, its
    standard error across rounds, how far the target is in those errors, and how many rounds were within it. This
    machine's speed moves from minute to minute; the pooled figure above does not say by how much."""
    rounds = " / ".join(f"{d:+.1f}" for d in diffs_ms)
    within = sum(d <= target_ms for d in diffs_ms)
    line = f"added p99 by round: {rounds} ms; within {target_ms:g} ms in {within} of {len(diffs_ms)}"
    if len(diffs_ms) < 2:
        return line
    mean = statistics.fmean(diffs_ms)
    se = statistics.stdev(diffs_ms) / len(diffs_ms) ** 0.5
    z = (target_ms - mean) / se if se > 0 else 0.0
    gap = f"the target {abs(z):.1f} of them {'above' if z >= 0 else 'below'} the mean" if se > 0 else "no spread"
    return f"{line}; mean {mean:+.1f} ms, standard error {se:.1f} ms ({gap})"


def print_blocks(conversations: list[tuple[str, list[dict[str, str]]]], verdicts: list[FilterVerdict]) -> None:
    """How many conversations of each kind the pre-filter blocked (its ``verdicts``, one per conversation), how many
    by the classifier, and how many its screen passed without an encoder pass."""
    blocked = {"benign": 0, "jailbreak": 0, "harmful": 0}
    counts = dict(blocked)
    classified = {"benign": 0, "jailbreak": 0, "harmful": 0}
    judged = {"screen": 0, "model": 0, "second": 0}
    for (kind, _), verdict in zip(conversations, verdicts, strict=True):
        counts[kind] += 1
        blocked[kind] += verdict.blocked
        classified[kind] += verdict.blocked and (verdict.rule or "").startswith("classifier.")
        if verdict.judged_by:
            judged[verdict.judged_by] += 1
    print(
        "  blocked: " + ", ".join(f"{k} {blocked[k]}/{counts[k]} ({classified[k]} by the classifier)" for k in counts)
    )
    total = sum(judged.values())
    print(
        f"  the classifier judged {total} conversations: its screen alone passed {judged['screen']}, the encoder "
        f"judged {judged['model'] + judged['second']}"
        + (f", a cascade's second stage decided {judged['second']} of them" if judged["second"] else "")
    )


def main() -> int:
    from serving.config import ServingConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=2000, help="conversations for the pre-filter")
    parser.add_argument("--library-prompts", type=int, default=300, help="of those, run with ProfanityScorer too")
    parser.add_argument("--replies", type=int, default=200, help="streamed replies for the post-filter")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--classifier",
        type=Path,
        action="append",
        help="a trained safety-classifier folder: measure its added latency (repeat to compare versions in one run)",
    )
    parser.add_argument("--streams", type=int, default=32, help="concurrent requests for --classifier")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved off/on rounds for --classifier")
    parser.add_argument(
        "--prepare-threads",
        type=int,
        nargs="+",
        default=[ServingConfig().preparing_threads()],
        help="--classifier: worker threads preparing requests, as the gateway's prepare_threads (default: its "
        "default on this machine); 0: anyio's shared pool, as before 2026-11-29; several: each, interleaved",
    )
    parser.add_argument(
        "--generate-ms",
        type=float,
        default=250.0,
        help="--classifier: how long each stream generates between its requests (0: all streams check at once)",
    )
    args = parser.parse_args()

    from core.toxicity import CompiledProfanityScorer, ProfanityScorer

    conversations = build_conversations(args.prompts, args.seed)
    sizes = [sum(len(m["content"]) for m in c if m["role"] == "user") for _, c in conversations]
    print(
        f"pre-filter: {len(conversations)} conversations, user text {min(sizes)}-{max(sizes)} chars "
        f"(median {statistics.median(sizes):.0f})"
    )
    compiled = CompiledProfanityScorer()
    p99 = bench_pre("rules + CompiledProfanityScorer", conversations, compiled)
    if args.library_prompts:
        bench_pre("rules + ProfanityScorer (library)", conversations[: args.library_prompts], ProfanityScorer())
    print(f"\nstream post-filter: {args.replies} replies of 0.5-2 KB, 1-8 characters per token, scored per word")
    bench_stream(args.replies, args.seed, compiled)
    ok = p99 <= TARGET_MS
    if args.classifier:
        print(f"\nsafety classifier: {args.streams} concurrent streams, {args.rounds} rounds")
        ok = (
            bench_classifier(
                conversations, args.classifier, args.streams, args.rounds, args.generate_ms, args.prepare_threads
            )
            and ok
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
