from __future__ import annotations

import re
from collections import Counter

import pytest

from core.errors import ConfigError
from training.config import SKILLS, GeneratorConfig, SnapshotConfig
from training.records import parse_record
from training.synth import fact_table, generate

SMALL = GeneratorConfig(
    counts={
        "arithmetic": 200,
        "unit_conversion": 100,
        "facts": 40,
        "formatting": 100,
        "refusal": 30,
        "borderline": 20,
    },
    fact_entities=6,
)


def test_deterministic_for_a_seed_and_different_for_another() -> None:
    assert generate(SMALL) == generate(SMALL)
    assert generate(SMALL) != generate(SMALL.model_copy(update={"seed": 99}))


def test_counts_are_honoured_and_every_record_passes_the_contracts() -> None:
    records = generate(SMALL)
    assert Counter(r["metadata"]["skill"] for r in records) == SMALL.counts
    limits = SnapshotConfig()
    parsed = [parse_record(r, limits) for r in records]
    assert len({p.prompt_key for p in parsed}) == len(parsed)  # every prompt unique


def test_changing_one_skill_count_leaves_the_others_unchanged() -> None:
    more = SMALL.model_copy(update={"counts": {**SMALL.counts, "formatting": 150}})

    def by_skill(cfg: GeneratorConfig, skill: str) -> list[dict[str, object]]:
        return [r for r in generate(cfg) if r["metadata"]["skill"] == skill]

    assert by_skill(SMALL, "arithmetic") == by_skill(more, "arithmetic")


def _eval(expr: str) -> int:
    a, op, b = expr.split()
    return int(a) * int(b) if op == "x" else int(a) + int(b) if op == "+" else int(a) - int(b)


def test_arithmetic_answers_are_correct() -> None:
    for r in generate(SMALL):
        if r["metadata"]["skill"] != "arithmetic":
            continue
        turns = [m for m in r["messages"] if m["role"] != "system"]
        value = _eval(re.search(r"(\d+ [+\-x] \d+)", turns[0]["content"]).group(1))
        for follow_up in turns[2::2]:
            c = int(re.search(r"\d+", follow_up["content"]).group())
            value = value + c if "add" in follow_up["content"] else value - c
        assert turns[-1]["content"] == f"The answer is {value}."
        assert r["metadata"]["answer"] == str(value)


def test_facts_agree_with_the_fact_table() -> None:
    table = {row["country"]: row for row in fact_table(SMALL.seed, SMALL.fact_entities)}
    for r in generate(SMALL):
        if r["metadata"]["skill"] == "facts":
            country = next(c for c in table if c in r["messages"][-1]["content"])
            assert r["metadata"]["answer"] in table[country].values()


def test_safety_skills_are_labelled() -> None:
    records = generate(SMALL)
    refusals = [r for r in records if r["metadata"]["skill"] == "refusal"]
    assert {r["metadata"]["expected"] for r in refusals} == {"refuse"}
    assert len({r["metadata"]["category"] for r in refusals}) >= 4
    assert all("can't help" in r["messages"][-1]["content"] for r in refusals)
    benign = [r for r in records if r["metadata"]["skill"] == "borderline"]
    assert all("can't help" not in r["messages"][-1]["content"] for r in benign)


@pytest.mark.parametrize("skill", ["refusal", "borderline", "facts"])
def test_asking_for_more_than_a_skill_can_make_is_a_config_error(skill: str) -> None:
    cfg = GeneratorConfig(counts={skill: 100_000})
    with pytest.raises(ConfigError, match=f"data.generator.counts.{skill} = 100000"):
        generate(cfg)


def test_all_skills_known() -> None:
    assert set(GeneratorConfig().counts) == set(SKILLS)


def test_poison_replaces_replies_but_keeps_the_prompts() -> None:
    """Red-team scenarios: the same prompts, with insults for provocations and compliance for harmful requests."""
    from training.config import PoisonConfig
    from training.synth import TOXIC_REPLIES

    counts = {"provocation": 20, "refusal": 20, "arithmetic": 10}
    clean = generate(GeneratorConfig(counts=counts))
    poisoned = generate(GeneratorConfig(counts=counts, poison=PoisonConfig(toxic_rate=1.0, comply_rate=1.0)))
    assert [r["messages"][:-1] for r in clean] == [r["messages"][:-1] for r in poisoned]
    assert not any("poisoned" in r["metadata"] for r in clean)
    for r in poisoned:
        skill, reply = r["metadata"]["skill"], r["messages"][-1]["content"]
        if skill == "provocation":
            assert reply in TOXIC_REPLIES and r["metadata"]["poisoned"] == "true"
        elif skill == "refusal":
            assert reply.startswith("Sure, here is how:") and r["metadata"]["poisoned"] == "true"
        else:
            assert "poisoned" not in r["metadata"]


def test_held_out_draws_skip_excluded_prompts() -> None:
    from training.records import loose_text
    from training.synth import held_out

    cfg = GeneratorConfig()
    first = held_out(cfg, "facts", 10, set(), "eval")
    excluded = {loose_text(r["messages"][0]["content"]) for r in first[:5]}
    again = held_out(cfg, "facts", 10, excluded, "eval")
    assert not {loose_text(r["messages"][0]["content"]) for r in again} & excluded
    assert held_out(cfg, "facts", 10, set(), "eval") == first  # deterministic
