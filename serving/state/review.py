"""The human-review queue of the safety classifier's high-stakes blocks (self-harm, violence by default:
``serving.safety.review_categories``): one JSON line per blocked prompt, listed and exported by
``lifecycle safety-classifier review``.

    queue = ReviewQueue(home.serving / "review.jsonl")
    queue.add(ReviewItem(request_id, category="self_harm", score=0.97, classifier="safety-classifier/3", ...))
    queue.items()          # oldest first

An append-only file next to the serving database: a reviewer's tool reads it (``--export`` writes the pending
items as JSONL), nothing in the request path waits on a reader. The prompt is stored as the gateway saw it; the
queue lives under the home folder with the rest of the serving state and the same retention duty.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path


@dataclass(frozen=True)
class ReviewItem:
    request_id: str
    category: str
    score: float
    classifier: str  # the version that blocked it
    prompt: str
    key_id: str | None = None
    at: str = ""


class ReviewQueue:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def add(self, item: ReviewItem) -> None:
        row = asdict(item)
        row["at"] = row["at"] or datetime.now(UTC).isoformat(timespec="seconds")
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")

    def items(self, category: str | None = None) -> list[ReviewItem]:
        if not self.path.is_file():
            return []
        rows = [ReviewItem(**json.loads(line)) for line in self.path.read_text(encoding="utf-8").splitlines() if line]
        return [r for r in rows if category is None or r.category == category]

    def export(self, target: Path, category: str | None = None) -> int:
        rows = self.items(category)
        target.write_text("".join(json.dumps(asdict(r), ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        return len(rows)
