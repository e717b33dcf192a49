"""The rollout controller: reads the registry's deployment state and the request log, decides, then acts.

One ``tick`` (the Prefect ``rollout-controller`` flow on a short schedule, or ``lifecycle rollout tick``):

1. **Guard the champion.** A ``champion`` alias moved onto a version without a passing gate record (someone set it
   in the registry UI) is put back on the last champion the controller accepted (registered-model tag
   ``rollout.champion``); the version is tagged with why.
2. **Admit a challenger.** A version a reviewer gave the ``challenger`` alias (MLflow UI or
   ``lifecycle promote``) must have a passing gate record and must not be quarantined; else it loses the alias and
   gets a ``rollout.rejected`` tag saying why. With no champion at all it becomes champion directly (nothing to
   compare against). Otherwise its rollout starts: alias ``shadow`` on it, canary weight 0.
3. **Analyze and step.** The window since the current step began is read from the request log (and the shadow
   log while shadowing) and analysed by ``monitoring.canary``; ``monitoring.rollout.decide`` says hold, advance,
   promote, rollback or finish. Only then are aliases, the canary weight (registered-model tag ``rollout.weight``,
   which the gateways re-read every few seconds) and tags changed, in ``_apply``.

A rollback sets the weight to 0 and removes the aliases in one step, tags the version with status, reason and the
deciding metrics, and quarantines it: the controller never admits it again until ``lifecycle promote --force
--reason`` clears the quarantine. Every decision goes to the version's tags (``rollout.last_decision``), the
rollout's MLflow run (metrics per analysis), the audit log (alias moves) and ``decisions.jsonl``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from core.errors import RolloutError
from monitoring.canary import Verdict, analyze_canary, analyze_shadow, analyze_watch
from monitoring.config import RolloutPolicy
from monitoring.rollout import RolloutState, Transition, decide, start
from monitoring.window import LogRow, ShadowRow, shadow_stats, version_stats
from registry.store import CANARY_WEIGHT_TAG, Deployment, ModelVersion

log = logging.getLogger("lifecycle.rollout")

CHAMPION = "champion"
CHALLENGER = "challenger"
SHADOW = "shadow"
PREVIOUS = "previous-champion"
ACCEPTED_CHAMPION_TAG = "rollout.champion"  # registered-model tag: the champion the controller last accepted
QUARANTINE_TAG = "rollout.quarantined"
# version tags that describe a running rollout (cleared when it ends); outcome tags (status, reason ...) stay
_RUNNING_TAGS = (
    "rollout.version",
    "rollout.phase",
    "rollout.step",
    "rollout.weight",
    "rollout.passes",
    "rollout.failures",
    "rollout.started_at",
    "rollout.phase_started_at",
    "rollout.baseline",
)


class DeploymentRegistry(Protocol):
    """What the controller needs of the registry (``registry.store.MlflowRegistry`` implements it)."""

    def deployment(self, name: str) -> Deployment: ...

    def get(self, name: str, version: str) -> ModelVersion: ...

    def set_alias(self, name: str, alias: str, version: str, *, reason: str, actor: str) -> None: ...

    def remove_alias(self, name: str, alias: str, *, reason: str, actor: str) -> str | None: ...

    def set_tags(self, name: str, version: str, tags: dict[str, str]) -> None: ...

    def delete_tags(self, name: str, version: str, keys: list[str]) -> None: ...

    def set_model_tags(self, name: str, tags: dict[str, str]) -> None: ...

    def open_run(self, *, run_name: str, tags: dict[str, str], params: dict[str, Any] | None = None) -> str: ...

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int) -> None: ...

    def set_run_tags(self, run_id: str, tags: dict[str, str]) -> None: ...

    def end_run(self, run_id: str, status: str = "FINISHED") -> None: ...


class LogSource(Protocol):
    """What the controller reads of the serving database (``serving.state.store.ServingStore`` implements it)."""

    def request_log(
        self, since: datetime | None = None, model_version: str | None = None, limit: int | None = None
    ) -> Sequence[LogRow]: ...

    def shadow_log(
        self, since: datetime | None = None, shadow_version: str | None = None, limit: int | None = None
    ) -> Sequence[ShadowRow]: ...


@dataclass(frozen=True)
class Decision:
    """One thing the controller decided (and then did), as logged and shown by ``lifecycle rollout status``."""

    at: str
    model: str
    version: str
    # start | hold | advance | promote | rollback | finish | reject | revert | abort | promote-first | alert (watch)
    action: str
    phase: str | None
    weight: int
    reason: str
    verdict: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    checks: list[dict[str, Any]] = field(default_factory=list)

    def line(self) -> str:
        return f"{self.at}  {self.model}/{self.version}  {self.action:<8} weight {self.weight:>3}%  {self.reason}"


def gate_passed(mv: ModelVersion) -> bool:
    return mv.tags.get("gate.status") == "passed"


def quarantined(mv: ModelVersion) -> bool:
    return mv.tags.get(QUARANTINE_TAG) == "true"


class RolloutController:
    def __init__(
        self,
        registry: DeploymentRegistry,
        requests: LogSource,
        policy: RolloutPolicy,
        model_name: str,
        *,
        actor: str,
        decisions_path: Path,
    ) -> None:
        self.reg = registry
        self.requests = requests
        self.policy = policy
        self.name = model_name
        self.actor = actor
        self.decisions_path = decisions_path

    # --- the tick ---------------------------------------------------------------------------------------------

    def tick(self, now: datetime | None = None) -> list[Decision]:
        now = now or datetime.now(UTC)
        out: list[Decision] = []
        dep = self.reg.deployment(self.name)
        out += self._guard_champion(dep, now)
        dep = self.reg.deployment(self.name)
        champion = dep.aliases.get(CHAMPION)
        if champion is not None:
            champ = self.reg.get(self.name, champion)
            state = RolloutState.from_tags(champ.tags)
            if state is not None and state.phase == "watch":
                out += self._step(champ, state, dep, now)
                dep = self.reg.deployment(self.name)
        challenger = dep.aliases.get(CHALLENGER)
        if challenger is None:
            out += self._abandoned(dep, now)
        else:
            out += self._challenger(self.reg.get(self.name, challenger), dep, now)
        for d in out:
            self.record(d)
        return out

    def _guard_champion(self, dep: Deployment, now: datetime) -> list[Decision]:
        champion = dep.aliases.get(CHAMPION)
        accepted = dep.tags.get(ACCEPTED_CHAMPION_TAG)
        if champion is None or champion == accepted:
            return []
        mv = self.reg.get(self.name, champion)
        if gate_passed(mv) and not quarantined(mv):
            self.reg.set_model_tags(self.name, {ACCEPTED_CHAMPION_TAG: champion})
            reason = f"champion set to {mv.ref} outside a rollout; its gate passed: accepted"
            return [self._decision(now, mv.version, "accept", None, 100, reason)]
        why = "quarantined" if quarantined(mv) else f"no passing gate record (gate.status={mv.tags.get('gate.status')})"
        reason = f"{mv.ref} was made champion but has {why}"
        self.reg.set_tags(self.name, champion, {"rollout.rejected": reason, "rollout.rejected_at": _iso(now)})
        if accepted is not None:
            self.reg.set_alias(self.name, CHAMPION, accepted, reason=f"reverted: {reason}", actor=self.actor)
            reason += f"; champion reverted to {self.name}/{accepted}"
        else:
            self.reg.remove_alias(self.name, CHAMPION, reason=f"reverted: {reason}", actor=self.actor)
            reason += "; no earlier champion to return to: alias removed"
        return [self._decision(now, champion, "revert", None, 0, reason)]

    def _abandoned(self, dep: Deployment, now: datetime) -> list[Decision]:
        """The challenger alias vanished mid-rollout (removed by hand): stop the rollout cleanly."""
        if dep.canary_weight == 0 and SHADOW not in dep.aliases:
            return []
        shadowed = dep.aliases.get(SHADOW)
        self.reg.set_model_tags(self.name, {CANARY_WEIGHT_TAG: "0"})
        reason = "the challenger alias was removed outside the controller: canary weight 0"
        if shadowed is not None:
            self.reg.remove_alias(self.name, SHADOW, reason="rollout abandoned (challenger removed)", actor=self.actor)
            mv = self.reg.get(self.name, shadowed)
            self._end(mv, "abandoned", reason, now)
            return [self._decision(now, shadowed, "abort", "shadow", 0, reason)]
        return [self._decision(now, "-", "abort", None, 0, reason)]

    def _challenger(self, mv: ModelVersion, dep: Deployment, now: datetime) -> list[Decision]:
        if quarantined(mv) or not gate_passed(mv):
            why = (
                f"quarantined ({mv.tags.get('rollout.quarantine_reason', 'rolled back earlier')}); "
                "lifecycle promote --force --reason clears it"
                if quarantined(mv)
                else f"no passing gate record (gate.status={mv.tags.get('gate.status', 'missing')}); "
                f"run: lifecycle gate {mv.name} {mv.version}"
            )
            reason = f"{mv.ref} cannot be rolled out: {why}"
            self.reg.set_tags(self.name, mv.version, {"rollout.rejected": reason, "rollout.rejected_at": _iso(now)})
            self.reg.remove_alias(self.name, CHALLENGER, reason=reason, actor=self.actor)
            return [self._decision(now, mv.version, "reject", None, 0, reason)]
        champion = dep.aliases.get(CHAMPION)
        if champion is None:
            reason = f"no champion to compare against: {mv.ref} becomes champion directly"
            self.reg.remove_alias(self.name, CHALLENGER, reason=reason, actor=self.actor)
            self.reg.set_alias(self.name, CHAMPION, mv.version, reason=reason, actor=self.actor)
            self.reg.set_model_tags(self.name, {ACCEPTED_CHAMPION_TAG: mv.version, CANARY_WEIGHT_TAG: "0"})
            self.reg.set_tags(self.name, mv.version, {"rollout.status": "promoted", "rollout.reason": reason})
            return [self._decision(now, mv.version, "promote", None, 100, reason)]
        if champion == mv.version:
            reason = f"{mv.ref} is already champion: challenger alias removed"
            self.reg.remove_alias(self.name, CHALLENGER, reason=reason, actor=self.actor)
            return [self._decision(now, mv.version, "reject", None, 100, reason)]
        state = RolloutState.from_tags(mv.tags)
        if state is None:
            return [self._start(mv, champion, now)]
        return self._step(mv, state, dep, now)

    def _start(self, mv: ModelVersion, champion: str, now: datetime) -> Decision:
        state = start(mv.version, champion, now)
        shadowing = self.policy.shadow_min_samples > 0
        if not shadowing:  # no shadow phase: straight to the first canary step
            state = RolloutState(
                version=mv.version,
                phase="canary",
                step=0,
                weight=self.policy.steps[0],
                passes=0,
                failures=0,
                started_at=now,
                phase_started_at=now,
                baseline_version=champion,
            )
        run_id = self.reg.open_run(
            run_name=f"rollout {mv.ref}",
            tags={"lifecycle.kind": "rollout", "rollout.model": mv.ref, "rollout.baseline": f"{self.name}/{champion}"},
            params={"policy": self.policy.model_dump(mode="json"), "baseline": f"{self.name}/{champion}"},
        )
        self.reg.set_tags(
            self.name,
            mv.version,
            {**state.to_tags(), "rollout.run_id": run_id, "rollout.status": "running", "rollout.reason": "started"},
        )
        reason = f"gate passed; rollout started against champion {self.name}/{champion}"
        if shadowing:
            self.reg.set_alias(self.name, SHADOW, mv.version, reason=f"rollout: {reason}", actor=self.actor)
            reason += f" in shadow (until {self.policy.shadow_min_samples} compared pairs)"
        self.reg.set_model_tags(self.name, {CANARY_WEIGHT_TAG: str(state.weight)})
        return self._decision(now, mv.version, "start", state.phase, state.weight, reason)

    # --- analysis ---------------------------------------------------------------------------------------------

    def analyze(self, state: RolloutState, now: datetime) -> Verdict:
        since = state.phase_started_at
        candidate = f"{self.name}/{state.version}"
        baseline = f"{self.name}/{state.baseline_version}"
        if state.phase == "shadow":
            return analyze_shadow(shadow_stats(self.requests.shadow_log(since=since), candidate), self.policy)
        rows = self.requests.request_log(since=since)
        if state.phase == "canary":
            return analyze_canary(version_stats(rows, baseline), version_stats(rows, candidate), self.policy)
        # watch: the promoted version now vs the previous champion over the same length of time before promotion
        before = self.requests.request_log(since=since - timedelta(seconds=self.policy.watch_s))
        base_rows = [r for r in before if r.at < since]
        return analyze_watch(version_stats(base_rows, baseline), version_stats(rows, candidate), self.policy)

    def _step(self, mv: ModelVersion, state: RolloutState, dep: Deployment, now: datetime) -> list[Decision]:
        verdict = self.analyze(state, now)
        transition = decide(state, verdict, self.policy, now)
        self._apply(mv, state, transition, verdict, dep, now)
        weight = transition.state.weight if transition.state else (100 if transition.action == "finish" else 0)
        d = self._decision(now, mv.version, transition.action, state.phase, weight, transition.reason, verdict)
        run_id = mv.tags.get("rollout.run_id")
        if run_id:
            step = int(mv.tags.get("rollout.analyses", "0"))
            self.reg.log_metrics(run_id, {**verdict.metrics(), "weight": float(weight)}, step)
            self.reg.set_tags(self.name, mv.version, {"rollout.analyses": str(step + 1)})
        return [d]

    def _apply(
        self,
        mv: ModelVersion,
        state: RolloutState,
        t: Transition,
        verdict: Verdict,
        dep: Deployment,
        now: datetime,
    ) -> None:
        """The side effects of a decision: the only place that moves traffic."""
        name, v = self.name, mv.version
        if t.action == "rollback":
            self.rollback(mv, t.reason, now, evidence=verdict, watch=state.phase == "watch", dep=dep)
            return
        if t.action == "finish":
            self._end(mv, "promoted", t.reason, now)
            return
        assert t.state is not None, "hold, advance and promote carry the next state"
        nxt = t.state
        if t.action == "advance" and state.phase == "shadow":
            self.reg.remove_alias(name, SHADOW, reason=f"rollout: {t.reason}", actor=self.actor)
        if t.action == "promote":
            old = dep.aliases.get(CHAMPION)
            self.reg.set_model_tags(name, {CANARY_WEIGHT_TAG: "0"})
            if old is not None:
                self.reg.set_alias(name, PREVIOUS, old, reason=f"replaced by {mv.ref}: {t.reason}", actor=self.actor)
            self.reg.set_alias(name, CHAMPION, v, reason=f"rollout: {t.reason}", actor=self.actor)
            self.reg.remove_alias(name, CHALLENGER, reason=f"promoted to champion: {t.reason}", actor=self.actor)
            self.reg.set_model_tags(name, {ACCEPTED_CHAMPION_TAG: v})
            nxt = RolloutState(**{**asdict(nxt), "baseline_version": old or nxt.baseline_version})
        elif nxt.weight != state.weight:
            self.reg.set_model_tags(name, {CANARY_WEIGHT_TAG: str(nxt.weight)})
        self.reg.set_tags(name, v, {**nxt.to_tags(), "rollout.last_decision": f"{t.action}: {t.reason}"[:4000]})

    # --- outcomes (also the manual big red button) -----------------------------------------------------------

    def rollback(
        self,
        mv: ModelVersion,
        reason: str,
        now: datetime | None = None,
        *,
        evidence: Verdict | None = None,
        watch: bool = False,
        dep: Deployment | None = None,
    ) -> Decision:
        """Weight 0 first, then the aliases; the version is tagged with why and quarantined."""
        now = now or datetime.now(UTC)
        dep = dep or self.reg.deployment(self.name)
        name, v = self.name, mv.version
        self.reg.set_model_tags(name, {CANARY_WEIGHT_TAG: "0"})
        if watch or dep.aliases.get(CHAMPION) == v:
            previous = dep.aliases.get(PREVIOUS)
            if previous is None or previous == v:
                raise RolloutError(f"{mv.ref} is champion and there is no previous-champion to roll back to")
            self.reg.set_alias(name, CHAMPION, previous, reason=f"rollback of {mv.ref}: {reason}", actor=self.actor)
            self.reg.set_model_tags(name, {ACCEPTED_CHAMPION_TAG: previous})
        for alias in (CHALLENGER, SHADOW):
            if dep.aliases.get(alias) == v:
                self.reg.remove_alias(name, alias, reason=f"rolled back: {reason}", actor=self.actor)
        tags = {
            QUARANTINE_TAG: "true",
            "rollout.quarantine_reason": reason[:4000],
            "rollout.metrics": json.dumps(evidence.metrics() if evidence else {}, sort_keys=True)[:4900],
            "rollout.failing": ",".join(evidence.failing) if evidence else "-",
        }
        self.reg.set_tags(name, v, tags)
        self._end(mv, "rolled-back", reason, now)
        return self._decision(now, v, "rollback", None, 0, reason, evidence)

    def _end(self, mv: ModelVersion, status: str, reason: str, now: datetime) -> None:
        self.reg.set_tags(
            self.name,
            mv.version,
            {
                "rollout.status": status,
                "rollout.reason": reason[:4000],
                "rollout.ended_at": _iso(now),
                "rollout.last_decision": f"{status}: {reason}"[:4000],
            },
        )
        self.reg.delete_tags(self.name, mv.version, list(_RUNNING_TAGS))
        run_id = mv.tags.get("rollout.run_id")
        if run_id:
            self.reg.set_run_tags(run_id, {"rollout.status": status, "rollout.reason": reason})
            self.reg.end_run(run_id, "FINISHED" if status == "promoted" else "KILLED")

    # --- records ----------------------------------------------------------------------------------------------

    def _decision(
        self,
        now: datetime,
        version: str,
        action: str,
        phase: str | None,
        weight: int,
        reason: str,
        verdict: Verdict | None = None,
    ) -> Decision:
        return Decision(
            at=_iso(now),
            model=self.name,
            version=version,
            action=action,
            phase=phase,
            weight=weight,
            reason=reason,
            verdict=verdict.outcome if verdict else None,
            metrics=verdict.metrics() if verdict else {},
            checks=[asdict(c) for c in verdict.checks] if verdict else [],
        )

    def record(self, d: Decision) -> None:
        (log.warning if d.action in ("rollback", "revert", "reject", "abort") else log.info)("%s", d.line())
        self.decisions_path.parent.mkdir(parents=True, exist_ok=True)
        with self.decisions_path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(asdict(d), default=str) + "\n")

    def decisions(self, limit: int = 20) -> list[Decision]:
        return read_decisions(self.decisions_path, self.name, limit)


def read_decisions(path: Path, model: str, limit: int = 20) -> list[Decision]:
    if not path.is_file():
        return []
    rows: Iterable[dict[str, Any]] = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    picked = [Decision(**r) for r in rows if r.get("model") == model]
    return picked[-limit:]


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="seconds")
