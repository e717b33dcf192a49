"""From configured sources to a snapshot: ``make_snapshot(data, snapshot_cfg, home) -> Snapshot``.

Sources are the user's JSONL files (``data.sources``) plus, when enabled, the generator's output, which is
written once per generator config and generator code to ``$LIFECYCLE_HOME/data/generated/<hash>/chat.jsonl`` and
read back like any other file, so generated and real data pass the same contracts.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from core.hashing import sha256_json
from core.home import Home
from training.config import VARIED_SKILLS, DataConfig, GeneratorConfig, SnapshotConfig
from training.data.snapshot import Snapshot, build_snapshot
from training.data.synth import code_hash, generate, write_jsonl


def generated_source(cfg: GeneratorConfig, home: Home, avoid: Sequence[str] = ()) -> Path:
    """The generator's output for ``cfg`` (written once); ``avoid``: phrasings its varied skills leave out."""
    key = {"config": cfg.config_hash(), "code": code_hash()}
    if avoid and any(cfg.counts.get(s, 0) for s in VARIED_SKILLS):  # the only skills it changes
        key["avoid"] = sha256_json(sorted(avoid))
    path = home.generated_data / sha256_json(key)[:16] / "chat.jsonl"
    if not path.is_file():
        write_jsonl(generate(cfg, avoid), path)
    return path


def make_snapshot(data: DataConfig, cfg: SnapshotConfig, home: Home, avoid: Sequence[str] = ()) -> Snapshot:
    """The snapshot of ``data``'s sources and generator; ``avoid`` (the hand-written eval items' prompts) keeps
    the generator's varied skills from teaching their phrasings."""
    sources = [Path(s).expanduser().resolve() for s in data.sources]
    provenance = {}
    if data.generator.enabled:
        sources.append(generated_source(data.generator, home, avoid))
        provenance["generator"] = {
            "seed": data.generator.seed,
            "config_hash": data.generator.config_hash(),
            "counts": dict(data.generator.counts),
        }
    return build_snapshot(cfg, sources, home.snapshots, reports=home.reports, provenance=provenance)
