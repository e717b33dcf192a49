"""Content-addressed data snapshots: ``build_snapshot(cfg, sources, root) -> Snapshot``.

A snapshot is an immutable folder ``<root>/<sha256>/`` holding ``train.jsonl``, ``validation.jsonl``,
``test.jsonl`` and ``manifest.json``. Its name is the SHA-256 over every normalized record (see
``training/data/records.py``), one line per record, splits in a fixed order and records sorted by their own hash
within a split; the schema version is hashed too, the manifest's timestamp and source paths are not. So the same
records give the same hash on any machine, whatever the file names or line order, and one changed character
gives a new one. Building a snapshot that already exists writes nothing and returns it.

Contracts are checked before anything is written (schema, role order, empty turns, lengths, exact and
normalized duplicates, split leakage). With ``on_invalid="fail"`` (the default) the build stops with a report
listing each bad record as ``file:line: reason``; with ``"drop"`` they are dropped and the manifest counts them
by reason. Nothing is dropped silently.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from core.errors import DataError, InvalidRecordsError, NotFoundError, RecordProblem
from core.hashing import sha256_file
from training.config import SnapshotConfig
from training.data.pairs import PAIR_SCHEMA_VERSION, parse_pair
from training.data.records import SCHEMA_VERSION, Message, RecordInvalid, Scalar, loose_text, parse_record

SPLITS = ("train", "validation", "test")
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Snapshot:
    hash: str
    path: Path
    manifest: dict[str, Any]

    @property
    def short(self) -> str:
        return self.hash[:12]

    def split_path(self, split: str) -> Path:
        if split not in SPLITS:
            raise NotFoundError(f"unknown split {split!r} (have: {', '.join(SPLITS)})")
        return self.path / f"{split}.jsonl"

    def records(self, split: str) -> Iterator[dict[str, Any]]:
        with self.split_path(split).open(encoding="utf-8") as f:
            for line in f:
                yield json.loads(line)

    def verify(self) -> None:
        """Re-hash the stored files against the manifest (detects edits to an immutable snapshot)."""
        for name, expected in self.manifest["files"].items():
            if sha256_file(self.path / name) != expected:
                raise DataError(f"snapshot {self.short}: {name} does not match its manifest (was it edited?)")


class Record(Protocol):
    """What a snapshot needs of a record: a chat conversation (``training.data.records``) or a preference pair
    (``training.data.pairs``)."""

    @property
    def metadata(self) -> Mapping[str, Scalar]: ...
    @property
    def content_hash(self) -> str: ...
    @property
    def dedup_key(self) -> str: ...
    @property
    def prompt_key(self) -> str: ...
    @property
    def prompt(self) -> tuple[Message, ...]: ...
    def canonical(self) -> str: ...


@dataclass(frozen=True)
class Kind:
    """A kind of snapshot: how its records are parsed, and the tag and schema version its hash is salted with."""

    name: str
    parse: Callable[[Any, SnapshotConfig], Record]
    schema_version: int
    tag: str


CHAT = Kind("chat", parse_record, SCHEMA_VERSION, "snapshot")
PAIRS = Kind("preference", parse_pair, PAIR_SCHEMA_VERSION, "preference-snapshot")


@dataclass(frozen=True)
class _Accepted:
    record: Record
    source: str
    line: int


def source_files(sources: list[Path]) -> list[Path]:
    """Expand folders to the ``*.jsonl`` files below them (sorted); every path must exist."""
    files: list[Path] = []
    for src in sources:
        if src.is_dir():
            found = sorted(p for p in src.rglob("*.jsonl") if p.is_file())
            if not found:
                raise DataError(f"source folder {src} has no .jsonl files")
            files += found
        elif src.is_file():
            files.append(src)
        else:
            raise NotFoundError(f"source not found: {src}")
    if not files:
        raise DataError("no data sources: set data.sources or enable data.generator")
    return files


def _read(
    files: list[Path], cfg: SnapshotConfig, kind: Kind, holdout: Collection[str]
) -> tuple[list[_Accepted], list[RecordProblem], list[dict[str, Any]]]:
    accepted: list[_Accepted] = []
    problems: list[RecordProblem] = []
    described: list[dict[str, Any]] = []
    exact: dict[str, tuple[str, int]] = {}
    loose: dict[str, tuple[str, int]] = {}
    for path in files:
        name, count = str(path), 0
        with path.open(encoding="utf-8", errors="strict") as f:
            try:
                lines = list(f)
            except UnicodeDecodeError as exc:
                raise DataError(f"{name} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            count += 1
            try:
                record = kind.parse(json.loads(line), cfg)
            except json.JSONDecodeError as exc:
                problems.append(RecordProblem(name, lineno, "invalid_json", f"not valid JSON: {exc.msg}"))
                continue
            except RecordInvalid as exc:
                problems.append(RecordProblem(name, lineno, exc.code, exc.reason))
                continue
            held = [m.content for m in record.prompt if m.role == "user" and loose_text(m.content) in holdout]
            if held:
                problems.append(RecordProblem(name, lineno, "eval_leak", f"prompt {held[0][:60]!r} is in an eval set"))
                continue
            canonical = record.canonical()
            if canonical in exact:
                src, ln = exact[canonical]
                problems.append(RecordProblem(name, lineno, "duplicate", f"exact duplicate of {src}:{ln}"))
                continue
            if record.dedup_key in loose:
                src, ln = loose[record.dedup_key]
                problems.append(
                    RecordProblem(
                        name,
                        lineno,
                        "near_duplicate",
                        f"same text as {src}:{ln} after normalizing case and spacing",
                    )
                )
                continue
            exact[canonical] = loose[record.dedup_key] = (name, lineno)
            accepted.append(_Accepted(record, name, lineno))
        described.append({"path": name, "sha256": sha256_file(path), "records": count})
    return accepted, problems, described


def assign_split(prompt_key: str, cfg: SnapshotConfig) -> str:
    """Deterministic split of a prompt: a uniform number in [0, 1) from the salted hash of its prompt key."""
    digest = hashlib.sha256(f"{cfg.split_seed}:{prompt_key}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    if u < cfg.test_fraction:
        return "test"
    if u < cfg.test_fraction + cfg.validation_fraction:
        return "validation"
    return "train"


def check_leakage(splits: Mapping[str, list[Record]]) -> None:
    """No prompt (normalized) may appear in more than one split."""
    owner: dict[str, str] = {}
    leaks: list[str] = []
    for split, records in splits.items():
        for record in records:
            other = owner.setdefault(record.prompt_key, split)
            if other != split:
                leaks.append(f"prompt {record.prompt[-1].content[:60]!r} is in both {other} and {split}")
    if leaks:
        raise DataError(f"split leakage: {len(leaks)} prompt(s) in more than one split; first: {leaks[0]}")


def snapshot_hash(splits: Mapping[str, list[Record]], kind: Kind = CHAT) -> str:
    h = hashlib.sha256(f"chat-lifecycle/{kind.tag}/v{kind.schema_version}\n".encode())
    for split in SPLITS:
        for record in splits[split]:
            h.update(f"{split}\t{record.canonical()}\n".encode())
    return h.hexdigest()


def _write_report(problems: list[RecordProblem], reports: Path) -> Path:
    reports.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    path = reports / f"snapshot-rejected-{stamp}-{os.getpid()}.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for p in problems:
            f.write(json.dumps({"source": p.source, "line": p.line, "code": p.code, "reason": p.reason}) + "\n")
    return path


def build_snapshot(
    cfg: SnapshotConfig,
    sources: list[Path],
    root: Path,
    *,
    reports: Path,
    provenance: dict[str, Any] | None = None,
    kind: Kind = CHAT,
    holdout: Collection[str] = frozenset(),
) -> Snapshot:
    """Validate ``sources`` and write (or find) their snapshot under ``root``.

    ``provenance`` is stored in the manifest unhashed (for example the generator seed and config hash).
    ``kind`` says what the records are (chat conversations, or preference pairs: ``PAIRS``). A record with a user
    turn in ``holdout`` (prompts as ``loose_text``: the eval sets' prompts) breaks the ``eval_leak`` contract.
    """
    accepted, problems, described = _read(source_files(sources), cfg, kind, holdout)
    if problems and cfg.on_invalid == "fail":
        raise InvalidRecordsError(problems, str(_write_report(problems, reports)))
    if not accepted:
        raise DataError("no valid records in the sources")

    splits: dict[str, list[Record]] = {s: [] for s in SPLITS}
    for item in accepted:
        splits[assign_split(item.record.prompt_key, cfg)].append(item.record)
    check_leakage(splits)
    for split in SPLITS:
        splits[split].sort(key=lambda r: r.content_hash)
    digest = snapshot_hash(splits, kind)

    final = root / digest
    if (final / MANIFEST).is_file():
        return load_snapshot(root, digest)

    manifest: dict[str, Any] = {
        "hash": digest,
        "kind": kind.name,
        "schema_version": kind.schema_version,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "sources": described,
        **census(splits),
        "rejected": {
            "total": len(problems),
            "by_reason": dict(sorted(Counter(p.code for p in problems).items())),
        },
        "split": {
            "key": "normalized prompt",
            "seed": cfg.split_seed,
            "validation_fraction": cfg.validation_fraction,
            "test_fraction": cfg.test_fraction,
        },
        "limits": {
            "max_messages": cfg.max_messages,
            "max_message_chars": cfg.max_message_chars,
            "max_total_chars": cfg.max_total_chars,
        },
        "provenance": provenance or {},
    }
    if problems:
        manifest["rejected"]["report"] = str(_write_report(problems, reports))

    return store_snapshot(root, digest, splits, manifest)


def census(splits: Mapping[str, Sequence[Record]]) -> dict[str, Any]:
    """A manifest's ``counts`` (records per split) and ``skills`` (per split, records per ``metadata.skill``)."""
    return {
        "counts": {s: len(splits[s]) for s in SPLITS},
        "skills": {
            s: dict(sorted(Counter(str(r.metadata.get("skill", "unlabeled")) for r in splits[s]).items()))
            for s in SPLITS
        },
    }


def store_snapshot(root: Path, digest: str, splits: Mapping[str, list[Record]], manifest: dict[str, Any]) -> Snapshot:
    """Write ``splits`` (sorted, hashed to ``digest`` by the caller) and ``manifest`` (the files' hashes added) as
    the immutable folder ``root/digest``, atomically; an identical build that got there first wins."""
    final = root / digest
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{digest[:12]}-", dir=root))
    try:
        files = {}
        for split in SPLITS:
            path = tmp / f"{split}.jsonl"
            with path.open("w", encoding="utf-8") as f:
                for record in splits[split]:
                    f.write(record.canonical() + "\n")
            files[path.name] = sha256_file(path)
        manifest["files"] = files
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        for path in tmp.iterdir():
            path.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        try:
            tmp.rename(final)
        except OSError:
            if not (final / MANIFEST).is_file():  # lost a race to an identical build: keep the winner
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return load_snapshot(root, digest)


def load_snapshot(root: Path, ref: str) -> Snapshot:
    """Find a snapshot by its full hash or a unique prefix of at least 6 characters."""
    if len(ref) < 6:
        raise NotFoundError(f"snapshot reference {ref!r} is too short (give at least 6 hex characters)")
    matches = sorted(p for p in root.glob(f"{ref}*") if (p / MANIFEST).is_file()) if root.is_dir() else []
    if not matches:
        raise NotFoundError(f"no snapshot {ref!r} under {root}")
    if len(matches) > 1:
        raise NotFoundError(f"snapshot reference {ref!r} is ambiguous ({len(matches)} match)")
    manifest = json.loads((matches[0] / MANIFEST).read_text(encoding="utf-8"))
    return Snapshot(manifest["hash"], matches[0], manifest)


def list_snapshots(root: Path) -> list[Snapshot]:
    if not root.is_dir():
        return []
    found = [load_snapshot(root, p.name) for p in root.iterdir() if (p / MANIFEST).is_file()]
    return sorted(found, key=lambda s: s.manifest["created_at"])
