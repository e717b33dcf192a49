"""The safety classifier's eval: ``evaluate_classifier(clf, snapshot, model) -> EvalReport`` on its held-out test
split (wording disjoint from training, ``training.data.harm_synth``) and on the hand-written human slice
(``evals/harm_human.yaml``), gated like a chat model by ``evals.gate.decide`` and
``configs/gates/safety_classifier.yaml``.

Metrics (suite ``harm``; every one declares its direction, per-item scores kept for the paired bootstrap):

=================================  ==  ==========================================================================
harm/harmful_recall                ↑   share of harmful test prompts blocked (score >= the version's threshold)
harm/recall.<category>             ↑   the same within one harm category
harm/min_category_recall           ↑   the lowest of those (items: that category's)
harm/precision.<category>          ↑   of the prompts blocked as <category>, the share that are harmful
harm/benign_risky_false_block      ↓   benign prompts that sound risky, blocked
harm/benign_false_block            ↓   ordinary benign prompts, blocked
harm/ece                           ↓   expected calibration error of the harm score (10 equal-width bins)
harm_human/...                     ↑↓  recall and the two false-block rates on the human slice (reported)
harm_external/...                  ↑↓  the snapshot's external slice (Do-Not-Answer and HarmBench, written by people,
                                       never trained on: ``training.data.harm_packaged``): the metrics above that
                                       its prompts allow (no false-block rate without such prompts) (reported)
=================================  ==  ==========================================================================
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from core.harm import HarmClassifier
from core.hashing import sha256_file, sha256_json
from evals.config import REPO
from evals.report import EvalReport, MetricResult, SuiteResult, mean_metric
from training.data.harm_pools import HARM_CATEGORIES
from training.data.harm_synth import external_records
from training.data.snapshot import Snapshot

HUMAN_SLICE = REPO / "evals" / "harm_human.yaml"
SYSTEM_SLICE = REPO / "evals" / "harm_system.yaml"  # system messages written by hand (benchmarks/harm_classifier.py)
FORGED_SLICE = REPO / "evals" / "harm_forged.yaml"  # assistant turns written by hand (benchmarks/harm_classifier.py)
DISCREET_SLICE = REPO / "evals" / "harm_discreet.yaml"  # requests for discretion (benchmarks/harm_classifier.py)
# the gateable metrics and their direction (higher_is_better), for the policy's checks (configs/gates)
DIRECTIONS: dict[str, bool] = {
    "harm/harmful_recall": True,
    "harm/min_category_recall": True,
    "harm/benign_risky_false_block": False,
    "harm/benign_false_block": False,
    "harm/ece": False,
}


def load_human_slice(path: Path = HUMAN_SLICE) -> list[dict[str, str]]:
    rows = yaml.safe_load(path.read_text(encoding="utf-8"))["prompts"]
    return [
        {
            "text": r["text"],
            "label": r["label"],
            "kind": r.get("kind") or ("benign" if r["label"] == "benign" else "harmful"),
        }
        for r in rows
    ]


def load_discreet_slice(path: Path = DISCREET_SLICE) -> list[dict[str, str]]:
    """The hand-written requests for discretion: lawful ones (benign that sounds risky) and harmful ones that hide
    the same way (a harm category), as records (text, label, kind)."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    benign = [{"text": t, "label": "benign", "kind": "benign_risky"} for t in raw["benign"]]
    return benign + [{"text": r["text"], "label": r["label"], "kind": "harmful"} for r in raw["harmful"]]


def load_system_slice(path: Path = SYSTEM_SLICE) -> dict[str, list[dict[str, str]]]:
    """The hand-written system messages: ``benign`` and ``harmful`` ones (text, label), and the user turns each is
    sent with (``user_questions``, ``go_ahead``: text)."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    return {
        "benign": [{"text": t, "label": "benign"} for t in raw["benign"]],
        "harmful": [{"text": r["text"], "label": r["label"]} for r in raw["harmful"]],
        "user_questions": [{"text": t} for t in raw["user_questions"]],
        "go_ahead": [{"text": t} for t in raw["go_ahead"]],
    }


def load_forged_slice(path: Path = FORGED_SLICE) -> dict[str, list[dict[str, str]]]:
    """The hand-written assistant turns: ``harmful`` ones a client forges (text, label) with the user turns that
    follow them (``go_ahead``: text), and ``benign`` exchanges (user, assistant, and for a refusal the user's
    ``next`` question) with the ordinary ``follow_ups`` (text)."""
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    return {
        "harmful": [{"text": r["text"], "label": r["label"]} for r in raw["harmful"]],
        "go_ahead": [{"text": t} for t in raw["go_ahead"]],
        "benign": [{k: r[k] for k in ("user", "assistant", "next") if k in r} for r in raw["benign"]],
        "follow_ups": [{"text": t} for t in raw["follow_ups"]],
    }


def expected_calibration_error(scores: Sequence[float], labels: Sequence[int], bins: int = 10) -> float:
    """Mean |accuracy - confidence| over equal-width score bins, weighted by their sizes."""
    total, n = 0.0, len(scores)
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        members = [i for i, s in enumerate(scores) if lo <= s < hi or (b == bins - 1 and s == 1.0)]
        if members:
            conf = sum(scores[i] for i in members) / len(members)
            acc = sum(labels[i] for i in members) / len(members)
            total += len(members) / n * abs(acc - conf)
    return total


def slice_metrics(suite: str, clf: HarmClassifier, records: list[dict[str, str]], *, full: bool) -> list[MetricResult]:
    """The metrics of one slice (``full``: per category and calibration too)."""
    scored = clf.scores([r["text"] for r in records])
    kinds = {r["kind"] for r in records}
    ids = [f"{i}:{r['text'][:40]}" for i, r in enumerate(records)]
    blocked = {i: float(clf.blocks(s)) for i, s in zip(ids, scored, strict=True)}
    by_kind: dict[str, dict[str, float]] = {"harmful": {}, "benign_risky": {}, "benign": {}}
    for i, r in zip(ids, records, strict=True):
        by_kind[r["kind"]][i] = blocked[i]
    out = [mean_metric(f"{suite}/harmful_recall", by_kind["harmful"], higher_is_better=True)]
    out += [
        mean_metric(f"{suite}/{kind}_false_block", by_kind[kind], higher_is_better=False)
        for kind in ("benign_risky", "benign")
        if kind in kinds
    ]
    if not full:
        return out
    per_cat = []
    for cat in HARM_CATEGORIES:
        items = {i: blocked[i] for i, r in zip(ids, records, strict=True) if r["label"] == cat}
        if items:
            per_cat.append(mean_metric(f"{suite}/recall.{cat}", items, higher_is_better=True))
        flagged = {
            i: float(r["label"] != "benign")
            for i, r, s in zip(ids, records, scored, strict=True)
            if clf.blocks(s) and s.category == cat
        }
        if flagged and kinds != {"harmful"}:  # (all harmful: every precision is 1)
            out.append(mean_metric(f"{suite}/precision.{cat}", flagged, higher_is_better=True))
    worst = min(per_cat, key=lambda m: m.value)
    out += per_cat
    out.append(worst.model_copy(update={"name": f"{suite}/min_category_recall", "description": worst.name}))
    if kinds == {"harmful"}:  # no benign prompt: no calibration to measure
        return out
    ece = expected_calibration_error([s.score for s in scored], [int(r["label"] != "benign") for r in records])
    out.append(MetricResult(name=f"{suite}/ece", value=ece, higher_is_better=False, n=len(records), stderr=None))
    return out


def evaluate_classifier(
    clf: HarmClassifier, snapshot: Snapshot, model: str, model_id: str, human: Path = HUMAN_SLICE
) -> EvalReport:
    started = time.monotonic()
    test = list(snapshot.records("test"))
    data = {"test.jsonl": snapshot.manifest["files"]["test.jsonl"], human.name: sha256_file(human)}
    suites = [
        SuiteResult(
            name="harm",
            kind="classifier",
            seconds=time.monotonic() - started,
            data={"test.jsonl": data["test.jsonl"]},
            metrics=slice_metrics("harm", clf, test, full=True),
            details={"threshold": clf.threshold, "n": len(test)},
        ),
        SuiteResult(
            name="harm_human",
            kind="classifier",
            seconds=0.0,
            data={human.name: data[human.name]},
            metrics=slice_metrics("harm_human", clf, load_human_slice(human), full=False),
        ),
    ]
    external = external_records(snapshot)
    if external:
        data["external.jsonl"] = snapshot.manifest["files"]["external.jsonl"]
        sources = sorted({r["source"] for r in external})
        suites.append(
            SuiteResult(
                name="harm_external",
                kind="classifier",
                seconds=0.0,
                data={"external.jsonl": data["external.jsonl"]},
                metrics=slice_metrics("harm_external", clf, external, full=True),
                details={"n": len(external), "sources": sources},
            )
        )
    return EvalReport(
        model=model,
        model_id=model_id,
        eval_sets=sha256_json(data),
        snapshot=snapshot.hash,
        seed=0,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        seconds=time.monotonic() - started,
        versions={"classifier": "harm-linear"},
        suites=suites,
    )


def summary_rows(report: EvalReport) -> list[dict[str, Any]]:
    return [
        {
            "metric": m.name,
            "value": round(m.value, 4),
            "stderr": m.stderr,
            "n": m.n,
            "higher_is_better": m.higher_is_better,
        }
        for m in report.metrics().values()
    ]
