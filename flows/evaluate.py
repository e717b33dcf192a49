"""The ``evaluate`` flow (eval suites -> gate decision -> recorded on the version; ``lifecycle gate``) and the
scheduled ``champion-eval`` flow (daily: the champion through the suites again, a regression tagged, not acted on).

    lifecycle gate chat 3

The work is ``flows.gating``'s; these flows log it and publish the decision as a Prefect Markdown artifact.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from core.home import Home
from evals.report import SuiteResult
from flows import gating
from flows.config import LifecycleConfig
from flows.lock import attempt_guard
from flows.summaries import GateSummary


@task(name="gate")
def gate_task(cfg: LifecycleConfig, home: Home, ref: str, force: bool = False) -> gating.GateOutcome:
    logger = get_run_logger()

    def progress(result: SuiteResult) -> None:
        values = ", ".join(f"{m.name.split('/', 1)[1]} {m.value:.3f}" for m in result.metrics[:4])
        logger.info("suite %s: %s (%.1fs)", result.name, values, result.seconds)

    outcome = gating.gate_stage(cfg, home, ref, actor=f"flow-run:{flow_run.get_id()}", force=force, on_suite=progress)
    decision = outcome.decision
    (logger.info if decision.passed else logger.warning)("gate %s: %s", outcome.version.ref, decision.summary)
    return outcome


@flow(name="evaluate")
def evaluate_flow(cfg: LifecycleConfig, home: Home, ref: str, force: bool = False) -> GateSummary:
    """Evaluate a registered version (and the champion on the same items), decide the gate, record it."""
    t0 = time.perf_counter()
    outcome = gate_task(cfg, home, ref, force)
    decision = outcome.decision
    create_markdown_artifact(
        key="gate-decision",
        markdown=outcome.markdown,
        description=f"Gate {'passed' if decision.passed else 'failed'}: {outcome.version.ref}",
    )
    return GateSummary(
        flow_run_id=str(flow_run.get_id()),
        model=outcome.version.name,
        version=outcome.version.version,
        passed=decision.passed,
        summary=decision.summary,
        failing=decision.failing,
        champion=decision.champion,
        policy=decision.policy,
        eval_sets=decision.eval_sets,
        run_id=outcome.run_id,
        metrics=outcome.report.summary(),
        seconds_per_suite={s.name: s.seconds for s in outcome.report.suites},
        report_dir=str(outcome.files["decision"].parent),
        references=[gating.reference_json(r) for r in outcome.references],
        verdicts=decision.verdicts,
        stderrs={n: m.stderr for n, m in outcome.report.metrics().items() if m.stderr is not None},
        seconds=time.perf_counter() - t0,
    )


@flow(name="champion-eval")
def champion_eval_flow(cfg: LifecycleConfig, home: Home, force: bool = True) -> dict[str, Any]:
    """Scheduled daily: the champion through the eval suites again, judged by the gate policy's floors; a
    regression is tagged on the version and reported (see ``gating.champion_eval_stage``), not acted on."""
    attempt_guard(cfg.schedule.crash_retries)
    logger = get_run_logger()
    check = gating.champion_eval_stage(cfg, home, actor=f"flow-run:{flow_run.get_id()}", force=force)
    (logger.info if check.status == "ok" else logger.warning)(
        "champion %s: %s (%s)", check.version.ref, check.status, check.decision.summary
    )
    create_markdown_artifact(
        key="champion-eval", markdown=check.markdown, description=f"Champion {check.version.ref}: {check.status}"
    )
    return {"model": check.version.ref, "status": check.status, "failing": check.decision.failing}
