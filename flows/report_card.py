"""The report card ``lifecycle run`` writes of itself: ``reports/run-<time>/report.md`` under the home folder.

    report_card(summary)              # Markdown: the outcome, stage times, the model against the gate, versions,
                                      # the machine; a pure function of the run's typed summary
    report_card_path(home, started)   # where the loop writes it (flows/loop.py)

Every number in it comes from the ``RunSummary`` the loop returns, so it can be written, and tested, without running
the loop. It is the run's own record of what the README and docs/results.md quote: the machine is named next to the
numbers, as every published figure must be.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from core.home import Home
from evals.gate import MetricVerdict
from flows.summaries import GateSummary, RolloutSummary, RunSummary, TrainSummary

# the train flow's timings (TrainSummary.seconds), in the loop's order
TRAIN_STAGES = {
    "snapshot": "data snapshot",
    "base_model": "base model (tokenizer + pretraining, or found)",
    "self_replies": "self-replies (the base model's own replies, generated or found)",
    "finetune": "fine-tune (DeepSpeed ranks, export check)",
    "register": "register (MLflow)",
    "preference": "preference stage (pairs, reference pass, DPO, export check, register)",
}


def report_card_path(home: Home, started_at: datetime) -> Path:
    """``reports/run-<UTC time>/report.md``, named like the drift reports' folders."""
    return home.reports / f"run-{started_at.strftime('%Y%m%dT%H%M%S')}" / "report.md"


def report_card(run: RunSummary) -> str:
    """The run as Markdown, from its summary alone."""
    when = run.started_at.strftime("%Y-%m-%d %H:%M:%S UTC") if run.started_at else "time unknown"
    lines = [
        f"# lifecycle run, {when}",
        "",
        f"- **Result**: {_result(run.train, run.gate, run.rollout)}",
        *([f"- **Retrained**: {_result(r.train, r.gate, r.rollout)}"] if (r := run.retrain) else []),
        f"- **Champion**: {champion(run)}",
        f"- **Took**: {run.seconds:.1f} s ({run.seconds / 60:.1f} min)",
        f"- **Machine**: {_machine(run)}",
        "",
        "## Stage times",
        "",
        "| stage | seconds | share |",
        "|---|---|---|",
        *_stage_rows(run),
        "",
        f"## {run.train.model}/{run.train.version} against the gate",
        "",
        *_gate_section(run.gate),
    ]
    if run.quantized:
        q = run.quantized
        lines += ["", f"## {q.model}/{q.version}, quantized from {run.train.model}/{run.train.version}, against it", ""]
        lines += _gate_section(q)
    if run.retrain:
        lines += ["", f"## {run.retrain.train.model}/{run.retrain.train.version} against the gate", ""]
        lines += _gate_section(run.retrain.gate)
    lines += ["", "## Versions", "", "| | |", "|---|---|", *_version_rows(run), ""]
    return "\n".join(lines)


def champion(run: RunSummary) -> str:
    """Who holds ``champion`` once the run is over, and whether this run put it there."""
    last = run.retrain.rollout if run.retrain and run.retrain.rollout else run.rollout
    if last is None:
        if not run.gate.passed:
            return f"unchanged (the gate stopped {run.gate.model}/{run.gate.version})"
        return "unchanged (this run rolled nothing out: run.rollout is off)"
    version = last.aliases.get("champion")
    if version is None:
        return "none"
    ref = f"{last.model}/{version}"
    rollouts = [r for r in (run.rollout, run.retrain.rollout if run.retrain else None) if r is not None]
    if any(r.outcome == "promoted" and r.version == version for r in rollouts):
        return f"{ref} (promoted in this run)"
    if any(r.outcome == "unchanged" and r.version == version for r in rollouts):
        return f"{ref} (already the champion)"
    return f"{ref} (kept: this run's version did not replace it)"


def _result(train: TrainSummary, gate: GateSummary, rollout: RolloutSummary | None) -> str:
    outcome = rollout.outcome if rollout else ("not rolled out" if gate.passed else "stopped at the gate")
    parent = f", SFT parent {train.sft_parent}" if train.sft_parent else ""
    return (
        f"{train.model}/{train.version} (base {train.base_model_version}{parent}): gate "
        f"{'passed' if gate.passed else 'FAILED'}, rollout {outcome}"
    )


def _machine(run: RunSummary) -> str:
    env = run.environment
    return "not recorded" if env is None else f"{env.cpu} ({env.isa_class}), {env.cores} cores"


def _stage_rows(run: RunSummary) -> list[str]:
    stages = [(TRAIN_STAGES.get(k, k), s) for k, s in _ordered(run.train.seconds)]
    stages.append(
        (f"gate ({run.gate.model}/{run.gate.version}, its champion and references evaluated)", run.gate.seconds)
    )
    if run.quantized:
        q = run.quantized
        stages.append((f"quantize into {q.model}/{q.version}", run.quantize_seconds))
        stages.append((f"gate ({q.model}/{q.version} against its parent)", q.seconds))
    if run.rollout:
        stages.append(("gateway start, simulated users, shadow and canary rollout", run.rollout.seconds))
    if run.drift:
        stages.append(("drift check on the run's traffic", float(run.drift["drift"]["seconds"])))
    if run.retrain:
        r = run.retrain
        retrain = sum(r.train.seconds.values()) + r.gate.seconds + (r.rollout.seconds if r.rollout else 0.0)
        stages.append(("retrain: train, gate, rollout", retrain))
    rest = run.seconds - sum(s for _, s in stages)
    stages.append(("the rest: orchestration (Prefect's engine and API), the flows' own work", max(rest, 0.0)))
    total = run.seconds or 1.0
    rows = [f"| {name} | {s:.1f} | {s / total:.1%} |" for name, s in stages]
    return [*rows, f"| **total** | **{run.seconds:.1f}** | 100% |"]


def _ordered(seconds: dict[str, float]) -> list[tuple[str, float]]:
    known = [(k, seconds[k]) for k in TRAIN_STAGES if k in seconds]
    return known + [(k, s) for k, s in seconds.items() if k not in TRAIN_STAGES]


def _gate_section(gate: GateSummary) -> list[str]:
    verdicts = {v.metric: v for v in gate.verdicts}
    refs = gate.references
    head = ["metric", f"{gate.model}/{gate.version}", "gate floor", "verdict"]
    if gate.champion:
        head.append(f"champion {gate.champion}: value, change [CI]")
    head += [f"{r['ref']} ({r['tag'].replace('_', ' ')}): value, change [CI]" for r in refs]
    lines = [
        f"Gate policy `{gate.policy}`, eval sets `{gate.eval_sets[:16]}`: {gate.summary}. Reports: "
        f"`{gate.report_dir}` (gate.md, report.json), MLflow run `{gate.run_id}`. A change is the paired "
        "improvement on the same items (positive: this version is better) with its paired bootstrap interval.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    names = list(gate.metrics) + [m for m in verdicts if m not in gate.metrics]
    for name in names:
        value = gate.metrics.get(name)
        stderr = gate.stderrs.get(name)
        cells = [
            name,
            "-" if value is None else f"{value:.3f}" + (f" ± {stderr:.3f}" if stderr is not None else ""),
            *_rule_cells(verdicts.get(name)),
        ]
        if gate.champion:
            cells.append(_champion_cell(verdicts.get(name)))
        cells += [_reference_cell(r, name) for r in refs]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _rule_cells(v: MetricVerdict | None) -> list[str]:
    if v is None:
        return ["-", "-"]
    floor = "-" if v.floor is None else f"{'≥' if v.higher_is_better else '≤'} {v.floor:g}"
    return [floor, v.verdict if v.verdict == "pass" else f"**{v.verdict}**: {v.reason}"]


def _champion_cell(v: MetricVerdict | None) -> str:
    if v is None or v.champion_value is None:
        return "-"
    ci = "" if v.ci_low is None or v.ci_high is None else f" [{v.ci_low:+.3f}, {v.ci_high:+.3f}]"
    delta = "" if v.delta is None else f", {v.delta:+.3f}{ci}"
    return f"{v.champion_value:.3f}{delta}"


def _reference_cell(ref: dict[str, Any], metric: str) -> str:
    row = next((r for r in ref["rows"] if r["metric"] == metric), None)
    if row is None:
        return "-"
    return (
        f"{row['reference_value']:.3f}, {row['improvement']:+.3f} [{row['ci_low']:+.3f}, {row['ci_high']:+.3f}] "
        f"{row['direction']}"
    )


def _version_rows(run: RunSummary) -> list[str]:
    t, lineage = run.train, run.train.lineage
    rows = [
        ("model version", f"{t.model}/{t.version}" + (f" (SFT parent {t.sft_parent})" if t.sft_parent else "")),
        ("base model", t.base_model_version),
        ("data snapshot", f"`{t.snapshot[:16]}` ({', '.join(f'{k} {v}' for k, v in t.snapshot_counts.items())})"),
    ]
    if lineage.get("preference_snapshot"):
        rows.append(("preference pairs", f"`{lineage['preference_snapshot'][:16]}`"))
    if run.retrain:
        r = run.retrain.train
        rows.append(("retrained version", f"{r.model}/{r.version} on snapshot `{r.snapshot[:16]}`"))
    rows += [
        ("eval sets", f"`{run.gate.eval_sets[:16]}`"),
        ("gate policy", run.gate.policy),
        ("config hash", f"`{lineage.get('config_hash', '-')[:16]}`"),
        ("code (git)", f"`{lineage.get('git_sha', '-')}`"),
        ("Prefect flow run (train)", f"`{t.flow_run_id}`"),
    ]
    env = run.environment
    if env is not None:
        rows.append(("python", env.python))
        rows += [(name, version) for name, version in env.packages.items()]
    return [f"| {k} | {v} |" for k, v in rows]
