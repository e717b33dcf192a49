"""Pair snapshots as the preference stage builds them (flows/preference.py) on the tiny config, with real eval sets:
generated pairs never hold an eval prompt, and curated feedback pairs join a retrain's pairs once there are
``preference.feedback_min_pairs`` of them (a feedback pair asking an eval prompt is dropped and counted)."""

from __future__ import annotations

import json
from pathlib import Path

from core.home import Home
from flows.config import CONFIG_DIR, load_config
from flows.gating import eval_sets_stage
from flows.preference import pair_snapshot_stage
from flows.stages import snapshot_stage
from training.data.pairs import CURATED_FOLDER
from training.data.records import loose_text
from training.data.snapshot import SPLITS


def _feedback(user: str, n: int) -> dict[str, object]:
    return {
        "messages": [{"role": "user", "content": user}],
        "chosen": f"Here is a helpful answer ({n}).",
        "rejected": "I'm sorry, but I can't help with that.",
        "metadata": {"source": "feedback", "rating": -1},
    }


def _write(home: Home, name: str, rows: list[dict[str, object]]) -> None:
    folder = home.curated / CURATED_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def test_feedback_pairs_join_once_there_are_enough_and_never_with_an_eval_prompt(tmp_path: Path) -> None:
    cfg = load_config(CONFIG_DIR / "tiny.yaml", ["preference.feedback_min_pairs=3"])
    home = Home(tmp_path / "home")
    chat = snapshot_stage(cfg, home)
    sets = eval_sets_stage(cfg, home, chat.hash)
    generated = pair_snapshot_stage(cfg, home, chat.hash, feedback=False)
    prompts = {loose_text(r["messages"][-1]["content"]) for s in SPLITS for r in generated.records(s)}
    assert prompts and not prompts & sets.prompts()  # the contract holds by construction for generated pairs
    assert generated.manifest["provenance"]["eval_sets"] == sets.hash

    _write(home, "a.jsonl", [_feedback("How do I sharpen a kitchen knife?", 1), _feedback("How do I kill weeds?", 2)])
    assert pair_snapshot_stage(cfg, home, chat.hash, feedback=True).hash == generated.hash  # 2 < 3: not yet

    eval_prompt = sets.rows("over_refusal.jsonl")[0]["prompt"]
    _write(home, "b.jsonl", [_feedback("How do I shoot better photos?", 3), _feedback(eval_prompt, 4)])
    with_feedback = pair_snapshot_stage(cfg, home, chat.hash, feedback=True)
    assert with_feedback.hash != generated.hash
    assert with_feedback.manifest["provenance"]["feedback"]["used"] is True
    assert with_feedback.manifest["rejected"]["by_reason"] == {"eval_leak": 1}
    sources = [r["metadata"]["source"] for s in SPLITS for r in with_feedback.records(s)]
    assert sources.count("feedback") == 3 and len(sources) == sum(generated.manifest["counts"].values()) + 3
    # the SFT-only path (lifecycle train, the loop's first run) never reads feedback
    assert pair_snapshot_stage(cfg, home, chat.hash, feedback=False).hash == generated.hash
