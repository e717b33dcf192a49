"""Curated production conversations as a snapshot source: ``export_curated(cfg, home, since, snapshot)``.

The glue between the gateway's database and ``training.data.curate``, which holds the rules (consent, completed
turns, safety, scrubbing, dedup: read its docstring). One export:

1. reads the conversations with a reply written in ``[since, until)`` from the serving database ``lifecycle serve``
   uses (``flows.stages.open_serving_store``); ``since`` defaults to the end of the previous export's window
   (none: from the start), ``until`` to now, so consecutive exports neither overlap nor leave a gap;
2. withdraws what earlier exports took from conversations that may no longer be used: the key opted out or was
   revoked, the conversation was deleted or purged. Those records leave the curated files, so the next snapshot no
   longer holds them (``withdrawn``);
3. curates with the gateway's safety filters (``serving.safety.filters``, both stages on even where the gateway runs
   without one), deduplicating against the prompts of ``snapshot`` and of the curated files on disk, and keeping
   out the prompts of the eval sets built for ``snapshot``;
4. writes the kept records to the curated-record store (``training.data.curated.CuratedStore``:
   ``$LIFECYCLE_HOME/data/curated/records/<content hash>.jsonl``) and the report to
   ``$LIFECYCLE_HOME/reports/curation-<time>.json``;
5. turns the feedback on record (``POST /v1/feedback``: thumbs up/down, better answers) into preference pairs with
   the same filters and held-out prompts (``training.data.curate_feedback``), recomputed from every rating before
   ``until`` and written as the one file ``$LIFECYCLE_HOME/data/curated/preferences/<content hash>.jsonl``
   (``CuratedStore.replace_preferences``): pairs whose key opted out or whose conversation was deleted are gone
   from it (``preferences.withdrawn``).

The record files accumulate across exports: ``CurationResult.sources`` lists every one on disk, to give the
snapshot builder as extra sources (``snapshot_with_curated`` builds the configured sources plus them). The same
conversations, window and data give the same file, byte for byte, and so the same snapshot hash.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from core.home import Home
from flows.config import LifecycleConfig
from flows.stages import eval_phrasings, open_serving_store
from serving.safety.filters import SafetyFilters, build_filters
from serving.state.schema import TrainingConversation, TrainingFeedback
from training.data.curate import (
    CurationReport,
    SafetyChecker,
    SourceConversation,
    SourceTurn,
    curate,
    prompt_keys,
    provenance_id,
)
from training.data.curate_feedback import PreferenceReport, SourceFeedback, curate_feedback
from training.data.curated import CuratedStore, PreferenceChange, write_atomic
from training.data.dataset import make_snapshot
from training.data.records import Message, loose_text
from training.data.snapshot import SPLITS, Snapshot


@dataclass(frozen=True)
class CurationResult:
    """One export: its window, the file it wrote (None when nothing was kept), every curated file now on disk
    (``sources``), how many earlier records it withdrew, its report and where that was written; and the preference
    pairs from feedback: the file now current, pairs added and withdrawn, and their report."""

    since: datetime | None
    until: datetime
    path: Path | None
    sources: list[Path]
    withdrawn: int
    report: CurationReport
    report_path: Path
    preferences: PreferenceChange
    preference_report: PreferenceReport

    def to_json(self) -> dict[str, Any]:
        p = self.preferences
        return {
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat(),
            "path": str(self.path) if self.path else None,
            "sources": [str(p) for p in self.sources],
            "withdrawn": self.withdrawn,
            "report": self.report.to_json(),
            "preferences": {
                "path": str(p.path) if p.path else None,
                "pairs": self.preference_report.pairs,
                "added": p.added,
                "withdrawn": p.withdrawn,
                "report": self.preference_report.to_json(),
            },
        }

    def summary(self) -> str:
        """One line of counts: conversations curated and preference pairs from feedback."""
        r, p = self.report, self.preference_report
        return (
            f"curated {r.kept} of {r.turns} new exchanges ({self.withdrawn} withdrawn); feedback: {p.pairs} "
            f"preference pairs ({self.preferences.added} new, {self.preferences.withdrawn} withdrawn) from "
            f"{p.rated} rated answers"
        )


class GatewaySafetyChecker:
    """``training.data.curate.SafetyChecker`` over the gateway's ``SafetyFilters``: the pre-filter on the prompt, the
    post-filter's ``check_text`` on the reply, and a reply carrying the gateway's stop text counts as stopped."""

    def __init__(self, filters: SafetyFilters) -> None:
        self._filters = filters
        self._stopped = filters.cfg.stopped_text.strip()

    def check_prompt(self, messages: Sequence[Message]) -> str | None:
        verdict = self._filters.pre.check([{"role": m.role, "content": m.content} for m in messages])
        return (verdict.rule or "blocked") if verdict.blocked else None

    def check_reply(self, text: str) -> str | None:
        if self._stopped and self._stopped in text:
            return "stopped"
        verdict = self._filters.check_text(text)
        return (verdict.rule or "blocked") if verdict.blocked else None


def gateway_checker(cfg: LifecycleConfig) -> GatewaySafetyChecker:
    """The production filters of ``cfg.serving.safety``, both stages switched on."""
    safety = cfg.serving.safety.model_copy(update={"pre_filter": True, "post_filter": True})
    return GatewaySafetyChecker(build_filters(safety))


def held_out_prompts(home: Home, snapshot: Snapshot) -> set[str]:
    """``loose_text`` of every prompt in the eval sets built for ``snapshot`` (the gate's held-out items)."""
    out: set[str] = set()
    root = home.eval_sets
    for manifest_path in sorted(root.glob("*/manifest.json")) if root.is_dir() else []:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        if manifest.get("snapshot") != snapshot.hash:
            continue
        for name in manifest.get("files", {}):
            for line in (manifest_path.parent / name).read_text(encoding="utf-8").splitlines():
                prompt = json.loads(line).get("prompt") if line.strip() else None
                if isinstance(prompt, str):
                    out.add(loose_text(prompt))
    return out


def _source(conv: TrainingConversation) -> SourceConversation:
    turns = tuple(SourceTurn(t.role, t.content, t.created_at, t.model_version, t.status) for t in conv.turns)
    return SourceConversation(conv.id, conv.key_id, conv.system, conv.opted_in, conv.deleted, turns)


def _feedback(fb: TrainingFeedback) -> SourceFeedback:
    prompt = tuple(Message(role, text) for role, text in fb.prompt) if fb.prompt is not None else None
    return SourceFeedback(
        fb.response_id,
        fb.key_id,
        fb.model_version,
        fb.status,
        fb.rating,
        fb.at,
        fb.opted_in,
        fb.deleted,
        prompt,
        fb.reply,
        fb.better_answer,
    )


def export_curated(
    cfg: LifecycleConfig,
    home: Home,
    since: datetime | None = None,
    snapshot: Snapshot | None = None,
    *,
    until: datetime | None = None,
    checker: SafetyChecker | None = None,
) -> CurationResult:
    """Curate the conversations of ``[since, until)`` into a snapshot source (see the module docstring).

    ``snapshot`` is the data the new records must not duplicate (normally the one the champion was trained on);
    ``checker`` defaults to the gateway's filters (``gateway_checker``).
    """
    for name, value in (("since", since), ("until", until)):
        if value is not None and value.tzinfo is None:
            raise ConfigError(f"curation {name} {value.isoformat()} has no time zone (give one, e.g. UTC)")
    store = CuratedStore(home.curated)
    until = until or datetime.now(UTC)
    since = since if since is not None else store.last_until()
    if since is not None and since >= until:
        raise ConfigError(f"curation window is empty: since {since.isoformat()} is not before {until.isoformat()}")
    with open_serving_store(cfg, home) as db:
        conversations = [_source(c) for c in db.training_conversations(since, until)]
        allowed = {provenance_id("conversation", conv_id) for conv_id in db.training_conversation_ids()}
        rated = [_feedback(f) for f in db.training_feedback(until)]
    withdrawn = store.withdraw(allowed)

    existing = store.prompt_keys()
    held_out: set[str] = set()
    if snapshot is not None:
        for split in SPLITS:
            existing |= prompt_keys(snapshot.records(split))
        held_out = held_out_prompts(home, snapshot)

    checker = checker or gateway_checker(cfg)
    curation = curate(
        conversations,
        checker=checker,
        limits=cfg.snapshot,
        since=since,
        until=until,
        existing=existing,
        held_out=held_out,
    )
    path = store.write(curation.jsonl()) if curation.records else None
    pairs = curate_feedback(rated, checker=checker, limits=cfg.snapshot, held_out=held_out)
    change = store.replace_preferences(pairs.jsonl())
    result = CurationResult(
        since=since,
        until=until,
        path=path,
        sources=store.sources(),
        withdrawn=withdrawn,
        report=curation.report,
        report_path=home.reports / f"curation-{until.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.json",
        preferences=change,
        preference_report=pairs.report,
    )
    write_atomic(
        result.report_path,
        json.dumps({**result.to_json(), "snapshot": snapshot.hash if snapshot else None}, indent=2) + "\n",
    )
    store.save_until(until)
    return result


def snapshot_with_curated(cfg: LifecycleConfig, home: Home, sources: Sequence[Path]) -> Snapshot:
    """The snapshot of the configured sources (and generator) plus the curated files ``sources``."""
    data = cfg.data.model_copy(update={"sources": [*cfg.data.sources, *(str(p) for p in sources)]})
    return make_snapshot(data, cfg.snapshot, home, eval_phrasings(cfg))
