"""How the commands print the flows' results for people (``--json`` prints the summaries themselves).

Typed with the flows' own result classes (``flows.summaries``, ``evals.report``), which are light to import.
"""

from __future__ import annotations

from typing import Any

from core.home import Home
from evals.report import EvalReport
from flows.config import LifecycleConfig
from flows.summaries import (
    GateSummary,
    RetrainSummary,
    RolloutStatus,
    RolloutSummary,
    RunSummary,
    TrainSummary,
    stat_cell,
)


def train_lines(summary: TrainSummary, home: Home) -> list[str]:
    m = summary.sft_metrics or summary.metrics  # with the preference stage: the SFT parent's, then the DPO line
    base = summary.base_model_metrics
    base_loss = (
        f"loss {base['final_loss']:.3f} vs unigram floor {base['unigram_entropy']:.3f}"
        if "final_loss" in base
        else "external"
    )
    secs = summary.seconds
    return [
        f"  flow run    {summary.flow_run_id}",
        f"  snapshot    {summary.snapshot[:12]}  "
        + ", ".join(f"{k} {v}" for k, v in summary.snapshot_counts.items())
        + f"  ({secs.get('snapshot', 0):.1f}s)",
        f"  base model  {summary.base_model_version}  ({base_loss}; {secs.get('base_model', 0):.1f}s)",
        f"  fine-tune   {'' if summary.sft_parent else summary.lineage.get('method', '') + ': '}"
        f"val loss {m['val_loss_initial']:.3f} -> {m['val_loss']:.3f}, "
        f"{m['tokens_per_s']:,.0f} tokens/s  ({secs.get('finetune', 0):.1f}s)",
        *_preference_lines(summary),
        f"  registered  {summary.model}/{summary.version}  (alias candidate; `lifecycle lineage {summary.model} "
        f"{summary.version}`)",
        f"  home        {home.root}",
    ]


def _preference_lines(summary: TrainSummary) -> list[str]:
    if summary.sft_parent is None:
        return []
    d = summary.metrics
    return [
        f"  SFT parent  {summary.sft_parent}",
        f"  preference  dpo on pairs {summary.lineage.get('preference_snapshot', '')[:12]}: val loss "
        f"{d['val_loss_initial']:.3f} -> {d['val_loss']:.3f}, reward accuracy {d['val_reward_accuracy_initial']:.2f} "
        f"-> {d['val_reward_accuracy']:.2f}  ({summary.seconds.get('preference', 0):.1f}s)",
    ]


def gate_lines(g: GateSummary) -> list[str]:
    return [
        f"  gate        {'PASSED' if g.passed else 'FAILED'}: {g.model}/{g.version} "
        f"(policy {g.policy}, champion {g.champion or 'none'})",
        f"              {g.summary}",
        "              " + ", ".join(f"{k} {v:.1f}s" for k, v in g.seconds_per_suite.items()),
        *(_reference_line(r) for r in g.references),
        f"  reports     {g.report_dir}  (MLflow run {g.run_id})",
    ]


def _reference_line(r: dict[str, Any]) -> str:
    by: dict[str, list[str]] = {"better": [], "same": [], "worse": []}
    for row in r["rows"]:
        by[row["direction"]].append(row["metric"])
    worse = f" ({', '.join(by['worse'])})" if by["worse"] else ""
    return (
        f"  vs {r['ref']:<9}better on {len(by['better'])}, same on {len(by['same'])}, worse on "
        f"{len(by['worse'])}{worse} of {len(r['rows'])} metrics ({r['tag']}, paired on the same items)"
    )


def rollout_lines(r: RolloutSummary | None) -> list[str]:
    if r is None:
        return []
    aliases = ", ".join(f"{a}={r.model}/{v}" for a, v in sorted(r.aliases.items()))
    lines = [f"  rollout     {r.model}/{r.version}: {r.outcome.upper()} ({r.seconds:.0f}s)  aliases: {aliases}"]
    if r.traffic:
        lines.append(
            f"              simulated traffic: {r.traffic['sent']} requests, by version {r.traffic['by_version']}"
        )
    lines += [f"              {d['action']:<8} {d['weight']:>3}%  {d['reason']}" for d in r.decisions]
    return lines


def drift_lines(d: dict[str, Any] | None) -> list[str]:
    """The run's drift check (``RetrainCheck.to_json()``: the report and the retrain decision)."""
    if d is None:
        return []
    drift = d["drift"]
    return [
        f"  drift       {drift['status'].upper()}: {drift['reason']}",
        f"              {drift['current_n']} prompts vs {drift['reference_n']} of {drift['champion']}'s data "
        f"({drift['seconds']:.1f}s); report {drift['html']}",
        f"  retrain     {d['summary']}",
    ]


def retrain_lines(r: RetrainSummary | None) -> list[str]:
    if r is None:
        return []
    return [
        f"  retrained   {r.train.model}/{r.train.version} on snapshot {r.snapshot[:12]} (with curated conversations)",
        *gate_lines(r.gate),
        *rollout_lines(r.rollout),
    ]


def summary_table(s: RunSummary, cfg: LifecycleConfig, home: Home, tracking: str) -> list[str]:
    """Versions, gate results and rollout outcomes in one table, then where to look (MLflow at ``tracking``,
    Prefect)."""
    rows = [("version", "snapshot", "gate", "rollout")]
    for train, gate, rollout in [(s.train, s.gate, s.rollout)] + (
        [(s.retrain.train, s.retrain.gate, s.retrain.rollout)] if s.retrain else []
    ):
        outcome = rollout.outcome if rollout else ("-" if gate.passed else "stopped at the gate")
        rows.append(
            (f"{train.model}/{train.version}", train.snapshot[:12], "passed" if gate.passed else "FAILED", outcome)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  " + "  ".join("-" * w for w in widths))
    lines += [
        "",
        f"  MLflow      {tracking}  (browse: lifecycle ui; model '{s.train.model}', experiment "
        f"'{cfg.registry.experiment}')",
        f"  Prefect     flow run {s.train.flow_run_id} and the rest of this run in `lifecycle ui` "
        f"(Prefect home {home.prefect})",
    ]
    return lines


def run_lines(s: RunSummary, cfg: LifecycleConfig, home: Home, tracking: str) -> list[str]:
    return [
        "",
        f"lifecycle run: done in {s.seconds:.0f}s",
        *train_lines(s.train, home),
        *gate_lines(s.gate),
        *rollout_lines(s.rollout),
        *drift_lines(s.drift),
        *retrain_lines(s.retrain),
        "",
        *summary_table(s, cfg, home, tracking),
        *([f"  report card {s.report_card}"] if s.report_card else []),
    ]


def suite_lines(report: EvalReport) -> list[str]:
    lines = []
    for suite in report.suites:
        lines.append(f"  {suite.name} ({suite.seconds:.1f}s)")
        for m in suite.metrics:
            err = f" ± {m.stderr:.3f}" if m.stderr is not None else ""
            arrow = "↑" if m.higher_is_better else "↓"
            lines.append(f"    {m.name.split('/', 1)[1]:<34} {m.value:8.3f}{err}  {arrow}  (n={m.n})")
    return lines


def status_lines(s: RolloutStatus) -> list[str]:
    aliases = "  ".join(f"{a}={s.model}/{v}" for a, v in s.aliases.items()) or "-"
    lines = [f"{s.model}: {aliases}", f"  canary weight  {s.canary_weight}%"]
    if s.state:
        st = s.state
        lines.append(
            f"  rollout        {s.model}/{st['version']}: {st['phase']} step {st['step']} weight {st['weight']}% "
            f"passes {st['passes']} failures {st['failures']} since {st['phase_started_at']}"
        )
    else:
        lines.append("  rollout        none in progress")
    if s.window:
        cols = ["requests", "success_rate", "ttft_p95_ms", "ttft_p99_ms", "tpot_p95_ms", "safety_hit_rate"]
        cols += ["refusal_rate", "abort_rate", "rated", "thumbs_down_rate"]
        lines.append("  window         " + "  ".join(f"{c:>15}" for c in ["version", *cols]))
        for ref, stats in s.window.items():
            lines.append(
                "                 " + "  ".join(f"{v:>15}" for v in [ref, *(stat_cell(stats[c]) for c in cols)])
            )
    lines.append("  last decisions" + ("" if s.decisions else "  none"))
    lines += [f"    {d.line()}" for d in s.decisions]
    return lines
