"""Curated production conversations as a snapshot source: ``export_curated(cfg, home, since, snapshot)``.

The glue between the gateway's database and ``training.curate``, which holds the rules (consent, completed
turns, safety, scrubbing, dedup: read its docstring). One export:

1. reads the conversations with a reply written in ``[since, until)`` from the serving database ``lifecycle serve``
   uses (``serve_spec``); ``since`` defaults to the end of the previous export's window (none: from the start),
   ``until`` to now, so consecutive exports neither overlap nor leave a gap;
2. withdraws what earlier exports took from conversations that may no longer be used: the key opted out or was
   revoked, the conversation was deleted or purged. Those records leave the curated files, so the next snapshot no
   longer holds them (``withdrawn``);
3. curates with the gateway's safety filters (``serving.safety``, both stages on even where the gateway runs
   without one), deduplicating against the prompts of ``snapshot`` and of the curated files on disk, and keeping
   out the prompts of the eval sets built for ``snapshot``;
4. writes the kept records to ``$LIFECYCLE_HOME/data/curated/records/<content hash>.jsonl`` and the report to
   ``$LIFECYCLE_HOME/reports/curation-<time>.json``.

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
from typing import TYPE_CHECKING, Any

from core.errors import ConfigError
from core.hashing import sha256_text
from core.home import Home
from flows.config import LifecycleConfig
from training.curate import (
    CurationReport,
    SafetyChecker,
    SourceConversation,
    SourceTurn,
    curate,
    prompt_keys,
    provenance_id,
)
from training.records import Message, loose_text
from training.snapshot import SPLITS, Snapshot

if TYPE_CHECKING:
    from serving.safety import SafetyFilters
    from serving.schema import TrainingConversation


@dataclass(frozen=True)
class CurationResult:
    """One export: its window, the file it wrote (None when nothing was kept), every curated file now on disk
    (``sources``), how many earlier records it withdrew, its report and where that was written."""

    since: datetime | None
    until: datetime
    path: Path | None
    sources: list[Path]
    withdrawn: int
    report: CurationReport
    report_path: Path

    def to_json(self) -> dict[str, Any]:
        return {
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat(),
            "path": str(self.path) if self.path else None,
            "sources": [str(p) for p in self.sources],
            "withdrawn": self.withdrawn,
            "report": self.report.to_json(),
        }


class GatewaySafetyChecker:
    """``training.curate.SafetyChecker`` over the gateway's ``SafetyFilters``: the pre-filter on the prompt, the
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
    from serving.safety import build_filters

    safety = cfg.serving.safety.model_copy(update={"pre_filter": True, "post_filter": True})
    return GatewaySafetyChecker(build_filters(safety))


def curated_dir(home: Home) -> Path:
    """The folder of curated record files (a snapshot source folder once it holds one)."""
    return home.root / "data" / "curated" / "records"


def _state_path(home: Home) -> Path:
    return home.root / "data" / "curated" / "state.json"


def curated_sources(home: Home) -> list[Path]:
    folder = curated_dir(home)
    return sorted(folder.glob("*.jsonl")) if folder.is_dir() else []


def last_export_until(home: Home) -> datetime | None:
    """The end of the previous export's window, None before the first export."""
    path = _state_path(home)
    if not path.is_file():
        return None
    return datetime.fromisoformat(json.loads(path.read_text(encoding="utf-8"))["until"])


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _write_records(home: Home, text: str) -> Path:
    """Write curated records under their content hash (an identical file is simply found again)."""
    path = curated_dir(home) / f"{sha256_text(text)[:16]}.jsonl"
    if not path.is_file():
        _write_atomic(path, text)
    return path


def _read_lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _withdraw(home: Home, allowed: set[str]) -> int:
    """Remove curated records whose conversation (by provenance hash) is not in ``allowed``; returns how many."""
    removed = 0
    for path in curated_sources(home):
        lines = _read_lines(path)
        keep = [line for line in lines if json.loads(line)["metadata"]["conversation"] in allowed]
        if len(keep) == len(lines):
            continue
        removed += len(lines) - len(keep)
        if keep:
            _write_records(home, "".join(line + "\n" for line in keep))
        path.unlink()
    return removed


def held_out_prompts(home: Home, snapshot: Snapshot) -> set[str]:
    """``loose_text`` of every prompt in the eval sets built for ``snapshot`` (the gate's held-out items)."""
    out: set[str] = set()
    root = home.eval_sets
    for manifest_path in sorted(root.glob("*/manifest.json")) if root.is_dir() else []:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        if manifest.get("snapshot") != snapshot.hash:
            continue
        for name in manifest.get("files", {}):
            for line in _read_lines(manifest_path.parent / name):
                prompt = json.loads(line).get("prompt")
                if isinstance(prompt, str):
                    out.add(loose_text(prompt))
    return out


def _source(conv: TrainingConversation) -> SourceConversation:
    turns = tuple(SourceTurn(t.role, t.content, t.created_at, t.model_version, t.status) for t in conv.turns)
    return SourceConversation(conv.id, conv.key_id, conv.system, conv.opted_in, conv.deleted, turns)


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
    from flows.cli import serve_spec  # the gateway's own view of its database
    from serving.runtime import database_url
    from serving.store import ServingStore

    for name, value in (("since", since), ("until", until)):
        if value is not None and value.tzinfo is None:
            raise ConfigError(f"curation {name} {value.isoformat()} has no time zone (give one, e.g. UTC)")
    until = until or datetime.now(UTC)
    since = since if since is not None else last_export_until(home)
    if since is not None and since >= until:
        raise ConfigError(f"curation window is empty: since {since.isoformat()} is not before {until.isoformat()}")
    with ServingStore(database_url(serve_spec(cfg, home))) as store:
        conversations = [_source(c) for c in store.training_conversations(since, until)]
        allowed = {provenance_id("conversation", conv_id) for conv_id in store.training_conversation_ids()}
    withdrawn = _withdraw(home, allowed)

    existing: set[str] = set()
    for source in curated_sources(home):
        existing |= prompt_keys(json.loads(line) for line in _read_lines(source))
    held_out: set[str] = set()
    if snapshot is not None:
        for split in SPLITS:
            existing |= prompt_keys(snapshot.records(split))
        held_out = held_out_prompts(home, snapshot)

    curation = curate(
        conversations,
        checker=checker or gateway_checker(cfg),
        limits=cfg.snapshot,
        since=since,
        until=until,
        existing=existing,
        held_out=held_out,
    )
    path = _write_records(home, curation.jsonl()) if curation.records else None
    result = CurationResult(
        since=since,
        until=until,
        path=path,
        sources=curated_sources(home),
        withdrawn=withdrawn,
        report=curation.report,
        report_path=home.reports / f"curation-{until.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.json",
    )
    _write_atomic(
        result.report_path,
        json.dumps({**result.to_json(), "snapshot": snapshot.hash if snapshot else None}, indent=2) + "\n",
    )
    _write_atomic(_state_path(home), json.dumps({"until": until.isoformat()}) + "\n")
    return result


def snapshot_with_curated(cfg: LifecycleConfig, home: Home, sources: Sequence[Path]) -> Snapshot:
    """The snapshot of the configured sources (and generator) plus the curated files ``sources``."""
    from training.dataset import make_snapshot

    data = cfg.data.model_copy(update={"sources": [*cfg.data.sources, *(str(p) for p in sources)]})
    return make_snapshot(data, cfg.snapshot, home)
