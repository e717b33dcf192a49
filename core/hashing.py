"""Content hashing: canonical JSON, files and folders. Every content address in the project comes from here."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys, no insignificant whitespace and non-ASCII kept as is: one spelling per value."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sha256_json(obj: Any) -> str:
    return sha256_text(canonical_json(obj))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256_files(root: Path, names: Iterable[str]) -> str:
    """Hash of the named files under ``root`` (name and bytes), in sorted name order."""
    h = hashlib.sha256()
    for name in sorted(names):
        h.update(name.encode("utf-8") + b"\0")
        h.update(bytes.fromhex(sha256_file(root / name)))
    return h.hexdigest()
