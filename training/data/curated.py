"""The curated-record store: production conversations curated for training, as snapshot source files on disk.

    store = CuratedStore(home.curated)
    store.write(curation.jsonl())     # records/<content hash>.jsonl (an identical file is simply found again)
    store.sources()                   # every record file: extra sources for the snapshot builder
    store.withdraw(allowed)           # drop records whose conversation may no longer be used
    store.untrained(snapshot)         # records the snapshot (the champion's data) does not hold yet
    store.replace_preferences(text)   # preferences/<content hash>.jsonl: the feedback pairs, recomputed per export

Layout: ``records/*.jsonl`` (one curated record a line, ``training.data.curate``'s format), ``preferences/*.jsonl``
(preference pairs from feedback, ``training.data.curate_feedback``'s format: one file, the whole current set) and
``state.json`` (the end of the last export's window, so consecutive exports neither overlap nor leave a gap). The
rules of what gets in live in ``training.data.curate`` (and ``training.data.curate_feedback``); reading the gateway's
database is the orchestration's glue (``flows.curation``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from core.hashing import sha256_file, sha256_text
from training.data.curate import prompt_keys
from training.data.snapshot import Snapshot, load_snapshot


@dataclass(frozen=True)
class PreferenceChange:
    """What ``CuratedStore.replace_preferences`` did: the current file, pairs added and withdrawn."""

    path: Path | None
    added: int
    withdrawn: int


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename: a reader sees the old file or the new."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _read_lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class CuratedStore:
    """The record files and the export state under one folder (``$LIFECYCLE_HOME/data/curated``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.records = root / "records"  # a snapshot source folder once it holds a file
        self.preferences = root / "preferences"  # a preference snapshot's source folder
        self._state = root / "state.json"

    def sources(self) -> list[Path]:
        """Every record file on disk, sorted."""
        return sorted(self.records.glob("*.jsonl")) if self.records.is_dir() else []

    def last_until(self) -> datetime | None:
        """The end of the previous export's window, None before the first export."""
        if not self._state.is_file():
            return None
        return datetime.fromisoformat(json.loads(self._state.read_text(encoding="utf-8"))["until"])

    def save_until(self, until: datetime) -> None:
        write_atomic(self._state, json.dumps({"until": until.isoformat()}) + "\n")

    def write(self, text: str) -> Path:
        """Write curated records under their content hash (an identical file is simply found again)."""
        path = self.records / f"{sha256_text(text)[:16]}.jsonl"
        if not path.is_file():
            write_atomic(path, text)
        return path

    def withdraw(self, allowed: set[str]) -> int:
        """Remove records whose conversation (by provenance hash) is not in ``allowed``; returns how many."""
        removed = 0
        for path in self.sources():
            lines = _read_lines(path)
            keep = [line for line in lines if json.loads(line)["metadata"]["conversation"] in allowed]
            if len(keep) == len(lines):
                continue
            removed += len(lines) - len(keep)
            if keep:
                self.write("".join(line + "\n" for line in keep))
            path.unlink()
        return removed

    def preference_sources(self) -> list[Path]:
        """The preference-pair files on disk, sorted (one after an export; none before the first pair)."""
        return sorted(self.preferences.glob("*.jsonl")) if self.preferences.is_dir() else []

    def replace_preferences(self, text: str) -> PreferenceChange:
        """Make ``text`` (the whole current set of pairs) the only preference file: written under its content hash,
        every other file removed. Returns the file (None when there are no pairs) and the lines that came and went:
        a pair whose feedback may no longer be used (opt-out, deletion) is ``withdrawn`` here."""
        before = {line for path in self.preference_sources() for line in _read_lines(path)}
        after = {line for line in text.splitlines() if line.strip()}
        path = None
        if after:
            path = self.preferences / f"{sha256_text(text)[:16]}.jsonl"
            if not path.is_file():
                write_atomic(path, text)
        for old in self.preference_sources():
            if old != path:
                old.unlink()
        return PreferenceChange(path, len(after - before), len(before - after))

    def prompt_keys(self) -> set[str]:
        """The dedup keys of every prompt in the store (``training.data.curate.prompt_keys``)."""
        keys: set[str] = set()
        for source in self.sources():
            keys |= prompt_keys(json.loads(line) for line in _read_lines(source))
        return keys

    def untrained(self, snapshot: Snapshot) -> int:
        """Records on disk in files that ``snapshot`` (normally the champion's data) does not hold as a source."""
        trained = trained_files(snapshot)
        files = [p for p in self.sources() if sha256_file(p) not in trained]
        return sum(len(_read_lines(p)) for p in files)


def trained_files(snapshot: Snapshot) -> set[str]:
    """The SHA-256 of every file ``snapshot`` was built from, through the snapshots it was derived from (the
    self-replies stage's snapshot names its source snapshot, kept beside it, instead of files)."""
    out: set[str] = set()
    for source in snapshot.manifest.get("sources", []):
        if "sha256" in source:
            out.add(source["sha256"])
        elif "snapshot" in source:
            out |= trained_files(load_snapshot(snapshot.path.parent, source["snapshot"]))
    return out
