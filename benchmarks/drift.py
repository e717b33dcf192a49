"""Drift check speed: ``monitoring.drift.detect_drift`` on 10k reference and 10k current prompts with the real
MiniLM embedder, against Evidently's own embedding-drift report (the path that fits a t-SNE for its plot).

    .venv/bin/python benchmarks/drift.py                       # 10k + 10k, Evidently's report at 1k a side
    .venv/bin/python benchmarks/drift.py --n 10000 --evidently-n 1000 2500 --max-embedded 250 1000 --full

Prompts: the reference is training-snapshot prompts (the opening user prompt of ``training.data.synth.generate``
records, two seeds, distinct); the current window is ``drifted``-profile traffic (``flows.traffic``), so the check
has something to find.

1. One-off costs, printed apart: importing Evidently and loading MiniLM.
2. ``detect_drift`` with the default config (``max_embedded_rows`` caps the embedded prompts per side, seeded):
   wall seconds of each stage (descriptors, embedding, embedding drift, total) and the process CPU seconds;
   MiniLM encodes on one torch thread (``--threads``; see ``core.embedding.MiniLmEmbedder``).
3. ``--max-embedded``: other caps; ``--full``: every distinct prompt embedded, to show what the cap buys.
4. Evidently's default path on the same embeddings at ``--evidently-n`` rows a side: ``Report([EmbeddingsDrift])``
   (its model method and a t-SNE of up to 2500 rows a side, drawn into the HTML) vs our call of the same method
   without the t-SNE; the ratio, and the HTML sizes. Its t-SNE sample stops growing at 2500 rows a side, so a run at
   2500 measures the t-SNE cost a 10k report pays; a run at 1000 only bounds it from below: the printed 10k
   figure for Evidently is an extrapolation, and says so.

CPU seconds count every thread of this process; on a machine shared with other jobs the wall seconds grow with the
load (printed before and after), the CPU seconds much less. Nothing here touches a GPU or the network.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TARGET_S = 10.0


class Clock:
    """Wall and process-CPU seconds of a block."""

    def __enter__(self) -> Clock:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu

    def __str__(self) -> str:
        return f"{self.wall:7.2f} s wall, {self.cpu:7.2f} s CPU"


class TimedEmbedder:
    """Wraps an embedder and adds up the wall and CPU seconds of its ``encode`` calls, and the texts embedded."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.wall = self.cpu = 0.0
        self.texts = 0

    def encode(self, texts: list[str]) -> NDArray[np.floating[Any]]:
        with Clock() as c:
            out = self.inner.encode(texts)
        self.wall, self.cpu, self.texts = self.wall + c.wall, self.cpu + c.cpu, self.texts + len(texts)
        return np.asarray(out)


def load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg()) + f" on {os.cpu_count()} CPUs"


def snapshot_prompts(n: int) -> list[str]:
    """Distinct opening user prompts of generated training data (a champion's reference), seed after seed."""
    from training.config import GeneratorConfig
    from training.data.synth import generate

    out: dict[str, None] = {}
    seed = 1234
    while len(out) < n:
        for record in generate(GeneratorConfig(seed=seed)):
            out.setdefault(next(m["content"] for m in record["messages"] if m["role"] == "user"))
        seed += 1
    return random.Random(0).sample(list(out), n)  # generate() lists its records skill by skill


def traffic(profile: str, n: int) -> list[str]:
    from flows.traffic import traffic_prompts
    from training.config import GeneratorConfig

    out: list[str] = []
    seed = 1
    while len(out) < n:  # in chunks: one big draw exhausts the finite skill pools slowly
        out += traffic_prompts(GeneratorConfig(), profile, min(2500, n - len(out)), seed=seed)
        seed += 1
    return out


def run_detect(name: str, ref: list[str], cur: list[str], cfg: Any, inner: Any) -> Any:
    from monitoring.drift import detect_drift
    from monitoring.drift_html import render_html

    embedder = TimedEmbedder(inner)
    with Clock() as c:
        report = detect_drift(ref, cur, cfg, embedder)
    s = report.seconds
    emb = report.embedding
    print(f"\n[{name}] {report.status}: {report.reason}")
    print(f"  descriptors     {s.descriptors_s:7.2f} s wall   ({report.reference_n} + {report.current_n} prompts)")
    rows = f"{emb.reference_rows} + {emb.current_rows} distinct prompts" if emb else "-"
    rate = f"{embedder.texts / embedder.wall:.0f} texts/s" if embedder.wall else "-"
    print(
        f"  embedding       {embedder.wall:7.2f} s wall, {embedder.cpu:7.2f} s CPU   ({embedder.texts} texts, {rate})"
    )
    print(f"                  rows embedded: {rows}")
    print(f"  embedding drift {s.embedding_drift_s:7.2f} s wall   ({cfg.embedding_method} method)")
    print(f"  total           {c}   target {TARGET_S:g} s: {'met' if c.wall <= TARGET_S else 'MISSED'}")
    print(f"  HTML            {len(render_html(report).encode()) / 1024:7.1f} KiB")
    return report


def evidently_default(ref: NDArray[np.float64], cur: NDArray[np.float64], n: int) -> dict[str, float]:
    """Evidently's own embedding drift report at ``n`` rows a side vs our call of the same method."""
    import pandas as pd
    from evidently import DataDefinition, Dataset, Report
    from evidently.metrics import EmbeddingsDrift

    from monitoring.drift import _embedding_drift
    from monitoring.drift_config import DriftConfig

    ref, cur = ref[:n], cur[:n]
    cols = [f"e{i}" for i in range(ref.shape[1])]
    definition = DataDefinition(numerical_columns=cols, embeddings={"prompt": cols})

    def dataset(x: NDArray[np.float64]) -> Any:
        return Dataset.from_pandas(pd.DataFrame(x, columns=cols), data_definition=definition)

    with Clock() as theirs:
        snapshot = Report([EmbeddingsDrift(embeddings_name="prompt")]).run(dataset(cur), dataset(ref))
        page = snapshot.get_html_str(as_iframe=False)
    with Clock() as ours:
        result = _embedding_drift(ref, cur, DriftConfig(max_embedded_rows=max(n, 200), min_samples=min(n, 200)))
    print(
        f"\n[Evidently EmbeddingsDrift report, {n} a side] {theirs}, HTML {len(page.encode()) / 1e6:.1f} MB\n"
        f"[same method, no t-SNE,           {n} a side] {ours}, score {result.score:.3f}"
        f"\n  ratio {theirs.wall / ours.wall:.0f}x wall"
    )
    return {"theirs": theirs.wall, "ours": ours.wall}


def evidently_descriptor_html(ref: list[str], cur: list[str]) -> None:
    """Size of Evidently's own HTML for the descriptor drift (the ValueDrift report detect_drift runs)."""
    import pandas as pd
    from evidently import DataDefinition, Dataset, Report
    from evidently.descriptors import NonLetterCharacterPercentage, TextLength, WordCount
    from evidently.metrics import ValueDrift

    def dataset(texts: list[str]) -> Any:
        descriptors = [TextLength("p", alias="length"), WordCount("p", alias="words")]
        descriptors.append(NonLetterCharacterPercentage("p", alias="non_letter"))
        frame = pd.DataFrame({"p": texts})
        return Dataset.from_pandas(frame, data_definition=DataDefinition(text_columns=["p"]), descriptors=descriptors)

    metrics = [ValueDrift(column=c) for c in ("length", "words", "non_letter")]
    page = Report(metrics).run(dataset(cur), dataset(ref)).get_html_str(as_iframe=False)
    print(f"\n[Evidently's HTML of the descriptor drift, {len(ref)} + {len(cur)}] {len(page.encode()) / 1e6:.1f} MB")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000, help="prompts a side")
    parser.add_argument("--evidently-n", type=int, nargs="*", default=[1000], help="rows a side for Evidently's path")
    parser.add_argument("--full", action="store_true", help="also run with every distinct prompt embedded")
    parser.add_argument("--max-embedded", type=int, nargs="*", default=[], help="other caps to run (rows a side)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the embedder (0: torch's default)")
    args = parser.parse_args()

    print(load())
    with Clock() as c:
        ref, cur = snapshot_prompts(args.n), traffic("drifted", args.n)
    print(f"prompts: {len(ref)} reference (snapshot), {len(cur)} current (drifted traffic) built in {c}")
    with Clock() as c:
        import evidently  # noqa: F401  (imported here to time it apart)
        from evidently import Report  # noqa: F401
    print(f"import evidently: {c}")
    from core.embedding import MiniLmEmbedder
    from monitoring.drift_config import DriftConfig

    minilm = MiniLmEmbedder(threads=args.threads or None)
    with Clock() as c:
        minilm.encode(["warm up"])
    print(f"load MiniLM: {c} (encode on {args.threads or 'torch default'} thread(s))")

    cfg = DriftConfig()
    capped = run_detect(f"default config, max_embedded_rows={cfg.max_embedded_rows}", ref, cur, cfg, minilm)
    for cap in args.max_embedded:
        if cap != cfg.max_embedded_rows:
            run_detect(f"max_embedded_rows={cap}", ref, cur, cfg.model_copy(update={"max_embedded_rows": cap}), minilm)
    full = None
    if args.full:
        full_cfg = cfg.model_copy(update={"max_embedded_rows": args.n})
        full = run_detect("every distinct prompt embedded", ref, cur, full_cfg, minilm)

    if args.evidently_n:
        largest = max(args.evidently_n)
        vectors = TimedEmbedder(minilm)
        rng = np.random.default_rng(0)  # a random sample: the snapshot lists its prompts skill by skill
        ref_d, cur_d = list(dict.fromkeys(ref)), list(dict.fromkeys(cur))
        ref_s = [ref_d[i] for i in rng.permutation(len(ref_d))[:largest]]
        cur_s = [cur_d[i] for i in rng.permutation(len(cur_d))[:largest]]
        ref_v = np.asarray(vectors.encode(ref_s), dtype=np.float64)
        cur_v = np.asarray(vectors.encode(cur_s), dtype=np.float64)
        print(f"\n(embedded {vectors.texts} more prompts for the comparison in {vectors.wall:.1f} s)")
        measured = {n: evidently_default(ref_v, cur_v, n) for n in sorted(args.evidently_n)}
        n = max(measured)
        overhead = measured[n]["theirs"] - measured[n]["ours"]  # t-SNE, its KDE and the plot at n a side
        for label, report in (("capped", capped), ("every distinct prompt", full)):
            if report is None or report.embedding is None:
                continue
            e = report.embedding
            drawn = max(min(2500, e.reference_rows), min(2500, e.current_rows))  # Evidently's t-SNE sample a side
            if n == drawn:
                how = "measured: its t-SNE sample stops growing at 2500 a side" if n == 2500 else "measured"
            elif n > drawn:
                how = f"an UPPER bound: measured on {n} a side, it would draw {drawn}"
            else:
                how = f"a LOWER bound: measured on {n} a side, it would draw {drawn}"
            method_s = report.seconds.embedding_drift_s
            print(
                f"\nextrapolated, not measured: Evidently's report on the {label} rows ({e.reference_rows} + "
                f"{e.current_rows}) ~ {method_s + overhead:.1f} s = our {method_s:.2f} s for the same method + "
                f"{overhead:.1f} s of t-SNE and plot ({how})"
            )
    evidently_descriptor_html(ref, cur)
    print("\n" + load())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
