"""The self-replies stage on a real vLLM engine and the tiny base model: the derived snapshot's replies are the
engine's greedy replies, its test split is the source's byte for byte, the eval sets and the pair snapshot build
from it, and a second call starts no engine; the train flow then fine-tunes on it and names it in the lineage; the
varied skills and the on-policy preference pairs (the SFT version's own replies) on the same engine."""

from __future__ import annotations

from typing import Any

import pytest
from support.helpers import engine_overrides

from core.home import Home
from core.refusal import is_refusal
from evals.runner import engine_placement
from flows import stages
from flows.config import CONFIG_DIR, LifecycleConfig, load_config
from flows.gating import eval_sets_stage
from flows.preference import pair_snapshot_stage
from training.data.records import normalize_text
from training.data.self_replies import stored_record
from training.data.snapshot import Snapshot, load_snapshot
from training.data.synth_pools import BASE_REPLY_PLACEHOLDER as PLACEHOLDER
from training.model.modelio import ModelFolder

MAX_TOKENS = 48


@pytest.fixture(scope="module")
def cfg() -> LifecycleConfig:
    return load_config(
        CONFIG_DIR / "tiny.yaml",
        [
            *engine_overrides(),
            "finetune.self_replies.enabled=true",
            "finetune.self_replies.skills=[borderline, formatting]",
            f"finetune.self_replies.max_tokens={MAX_TOKENS}",
            "finetune.self_replies.max_records=6",
            # its own registered models: the session home's "chat" belongs to test_train, which counts its versions
            "registry.model_name=chat-self-replies",
            "registry.base_model_name=chat-base-self-replies",
        ],
    )


def greedy(folder: str, prompts: list[Any], dtype: Any) -> list[tuple[str, str]]:
    """The engine's own greedy replies, on a plain ``vllm.LLM`` (not the stage's wrapper)."""
    from vllm import LLM, SamplingParams

    with engine_placement(in_process=True):
        llm = LLM(model=folder, dtype=dtype, seed=0, enforce_eager=True)
        try:
            out = llm.chat(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS), use_tqdm=False)
        finally:
            llm.llm_engine.engine_core.shutdown()
    return [(o.outputs[0].text, str(o.outputs[0].finish_reason)) for o in out]


def test_the_derived_snapshot_holds_the_engines_greedy_replies_and_is_found_again(
    cfg: LifecycleConfig,
    session_home: Home,
    tiny_snapshot: Snapshot,
    tiny_base_model: ModelFolder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    derived = stages.self_replies_stage(cfg, session_home, tiny_snapshot, tiny_base_model)
    info = derived.manifest["self_replies"]
    assert derived.manifest["derived_from"] == tiny_snapshot.hash
    assert info["base_weights_hash"] == tiny_base_model.identity
    assert info["selected"] == 6 == info["replaced"]["total"] + info["kept"]["total"]
    assert derived.split_path("test").read_bytes() == tiny_snapshot.split_path("test").read_bytes()

    source: dict[str, Any] = {
        stored_record(r).prompt_key: r for s in ("train", "validation") for r in tiny_snapshot.records(s)
    }
    changed = [
        (r, source[stored_record(r).prompt_key])
        for s in ("train", "validation")
        for r in derived.records(s)
        if r != source[stored_record(r).prompt_key]
    ]
    assert len(changed) == info["replaced"]["total"] >= 2, info
    prompts = [r["messages"][:-1] for r, _ in changed]
    expected = greedy(str(tiny_base_model.path), prompts, cfg.evals.engine.dtype)
    for (new, old), (text, finish) in zip(changed, expected, strict=True):
        assert new["messages"][-1]["content"] == normalize_text(text) and finish == "stop"
        assert new["messages"][:-1] == old["messages"][:-1] and new["metadata"] == old["metadata"]
        assert new["metadata"]["skill"] in ("borderline", "formatting")

    # what the gate and the preference stage read of the version's snapshot: the same eval items (the phrasing-leak
    # check included) and a pair snapshot held out from them
    sets, source_sets = (eval_sets_stage(cfg, session_home, s.hash) for s in (derived, tiny_snapshot))
    assert sets.manifest["snapshot"] == derived.hash and sets.manifest["content"] == source_sets.manifest["content"]
    pairs = pair_snapshot_stage(cfg, session_home, derived.hash, feedback=False)
    assert pairs.manifest["provenance"]["chat_snapshot"] == derived.hash and pairs.manifest["counts"]["train"] > 0

    def no_engine(*args: object) -> None:
        raise AssertionError("the second call started an engine")

    monkeypatch.setattr(stages, "chat_model", no_engine)
    assert stages.self_replies_stage(cfg, session_home, tiny_snapshot, tiny_base_model).hash == derived.hash
    assert stages.self_replies_stage(cfg, session_home, derived, tiny_base_model).hash == derived.hash


def test_the_train_flow_fine_tunes_on_the_derived_snapshot_and_names_it_in_the_lineage(
    cfg: LifecycleConfig,
    session_home: Home,
    tiny_snapshot: Snapshot,
    tiny_base_model: ModelFolder,
    prefect_harness: None,
) -> None:
    from flows.train import train_flow

    derived = stages.self_replies_stage(cfg, session_home, tiny_snapshot, tiny_base_model)
    flow_cfg = cfg.model_copy(update={"base_model": str(tiny_base_model.path)})
    summary = train_flow(flow_cfg, session_home)
    assert summary.snapshot == summary.lineage["snapshot"] == derived.hash
    assert list(summary.seconds)[:3] == ["snapshot", "base_model", "self_replies"]
    assert (summary.model, summary.version) == ("chat-self-replies", "1")


VARIED = {"refusal_varied": 14, "borderline_varied": 12, "everyday_varied": 8}


def test_the_varied_skills_train_only_on_the_engines_replies_and_keep_the_eval_phrasings_apart(
    tmp_path: Any, tiny_base_model: ModelFolder
) -> None:
    """configs/smollm2.yaml's data path with the varied skills, on the real engine: the generator leaves out every
    prompt phrased like a hand-written eval item (the eval sets build), and no record keeps its placeholder."""
    counts = {"formatting": 4, "refusal": 4, "borderline": 4, "provocation": 4, **VARIED}
    cfg = load_config(
        CONFIG_DIR / "smollm2.yaml",
        [*engine_overrides(), f"finetune.self_replies.max_tokens={MAX_TOKENS}"]
        + [f"data.generator.counts.{skill}={n}" for skill, n in counts.items()],
    )
    home = Home(tmp_path / "home")
    snapshot = stages.snapshot_stage(cfg, home)
    marked = [r for s in ("train", "validation", "test") for r in snapshot.records(s) if r["metadata"].get("reply")]
    assert len(marked) == VARIED["borderline_varied"] + VARIED["everyday_varied"]

    derived = stages.self_replies_stage(cfg, home, snapshot, tiny_base_model)
    info = derived.manifest["self_replies"]
    base_only = [r for s in ("train", "validation", "test") for r in derived.records(s) if r["metadata"].get("reply")]
    assert base_only and all(r["messages"][-1]["content"] != PLACEHOLDER for r in base_only)
    assert not [r for r in derived.records("test") if r["metadata"].get("reply")]
    dropped = info.get("dropped_base_only", {"total": 0})["total"]
    assert len(base_only) + dropped == len(marked)
    refusals = [r for r in derived.records("train") if r["metadata"]["skill"] == "refusal_varied"]
    assert refusals and all(is_refusal(r["messages"][-1]["content"]) for r in refusals)  # kept: the generated ones

    sets = eval_sets_stage(cfg, home, derived.hash)  # raises on a phrasing the training split teaches
    assert sets.manifest["counts"]["safety.jsonl"] > 0


ON_POLICY = {"refusal_varied": 6, "borderline_varied": 4, "everyday_varied": 2}


def test_the_preference_stage_pairs_the_sft_versions_own_replies(
    cfg: LifecycleConfig,
    session_home: Home,
    tiny_base_model: ModelFolder,
    prefect_harness: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The on-policy pair kinds through the train flow, on the real engine: each pair's model-written side is that
    model's greedy reply to the pair's prompt (the SFT version's for a rejected compliance or over-refusal, the
    base's otherwise), every drawn prompt is accounted for, and the pairs are found again without an engine."""
    from flows import preference
    from flows.train import train_flow

    flow_cfg = load_config(
        CONFIG_DIR / "tiny.yaml",
        [
            *engine_overrides(),
            "preference.enabled=true",
            f"preference.data.max_tokens={MAX_TOKENS}",
            "preference.data.counts={refusal: 8, borderline: 8}",
            *(f"preference.data.counts.{kind}={n}" for kind, n in ON_POLICY.items()),
            "registry.model_name=chat-on-policy",
            "registry.base_model_name=chat-base-on-policy",
        ],
    ).model_copy(update={"base_model": str(tiny_base_model.path)})
    summary = train_flow(flow_cfg, session_home)
    sft = stages.open_registry(flow_cfg, session_home).parse(str(summary.sft_parent))
    pairs = load_snapshot(session_home.preference_snapshots, summary.lineage["preference_snapshot"])
    on_policy = pairs.manifest["provenance"]["on_policy"]
    assert on_policy["policy"] == sft.ref and on_policy["drawn"] == ON_POLICY
    assert sum(on_policy["paired"].values()) + sum(on_policy["unpaired"].values()) == sum(ON_POLICY.values())

    records = [r for s in ("train", "validation", "test") for r in pairs.records(s)]
    made = [r for r in records if "rejected_from" in r["metadata"]]
    assert len(made) == sum(on_policy["paired"].values()) > 0 and len(records) > len(made)  # written pairs besides
    prompts = [r["messages"] for r in made]
    dtype = flow_cfg.evals.engine.dtype
    start = preference.sft_start_stage(flow_cfg, session_home, sft)
    own = [normalize_text(text) for text, _ in greedy(str(start.path), prompts, dtype)]
    # the base's replies, for the pairs that hold one (no engine started when none does)
    from_base = [
        i for i, r in enumerate(made) if "base" in (r["metadata"]["chosen_from"], r["metadata"]["rejected_from"])
    ]
    base = [""] * len(made)
    if from_base:
        replies = greedy(str(tiny_base_model.path), [prompts[i] for i in from_base], dtype)
        for i, (text, _) in zip(from_base, replies, strict=True):
            base[i] = normalize_text(text)
    for r, policy_says, base_says in zip(made, own, base, strict=True):
        meta = r["metadata"]
        if meta["kind"] == "refusal_varied":  # the refusal over a compliance: the policy's own, else the base's
            assert is_refusal(r["chosen"]) and meta["chosen_from"] == "generated"
            if meta["rejected_from"] == "policy":
                assert r["rejected"] == policy_says and not is_refusal(policy_says)
            else:
                assert is_refusal(policy_says) and r["rejected"] == base_says and not is_refusal(base_says)
        else:  # the base's answer over the policy's refusal
            assert (meta["chosen_from"], meta["rejected_from"]) == ("base", "policy")
            assert r["rejected"] == policy_says and is_refusal(policy_says) and not is_refusal(r["chosen"])
            assert base_says.startswith(r["chosen"])  # whole, or trimmed to its last sentence

    def no_engine(*args: object) -> None:
        raise AssertionError("the second call started an engine")

    monkeypatch.setattr(preference, "chat_model", no_engine)
    again = preference.pair_snapshot_stage(flow_cfg, session_home, sft.lineage["snapshot"], feedback=False, sft=sft)
    assert again.hash == pairs.hash
