from __future__ import annotations

import re
from collections import Counter

import pytest

from core.errors import ConfigError
from core.refusal import is_refusal
from evals.sets import phrasing_leaks
from training.config import BASE_REPLY_SKILLS, SKILLS, VARIED_SKILLS, GeneratorConfig, SnapshotConfig
from training.data.harm_generator import generate_harm
from training.data.harm_pools import HARM_CATEGORIES
from training.data.records import parse_record
from training.data.synth import fact_table, generate
from training.data.synth_pools import BASE_REPLY_PLACEHOLDER, VIOLENCE_REFUSAL

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
        assert turns[-1]["content"].endswith(f"The answer is {value}."), turns[-1]["content"]
        assert r["metadata"]["answer"] == str(value)


def test_every_worked_step_is_true_and_ends_in_the_answer() -> None:
    """All 20,000 two-digit sums and differences: each written step is a true one-digit equation with its carry
    or borrow, the tens step's result and the units digit spell the answer."""
    from training.data.synth import worked_answer

    step = re.compile(r"(\d+) ([+-]) (\d+)(?: ([+-]) (\d+))? = (\d+)")
    for a in range(100):
        for b in range(100):
            for op in "+-":
                reply = worked_answer(a, op, b)
                assert reply.endswith(f"The answer is {a + b if op == '+' else a - b}."), reply
                steps = step.findall(reply.split(":")[-1])
                assert len(steps) == 2, reply
                for x, o1, y, o2, z, result in steps:
                    value = int(x) + int(y) if o1 == "+" else int(x) - int(y)
                    value += (int(z) if o2 == "+" else -int(z)) if o2 else 0
                    assert value == int(result), (reply, x, o1, y, o2, z, result)
                units, tens = int(steps[0][5]), int(steps[1][5])
                assert 10 * tens + units % 10 == abs(a + b if op == "+" else a - b), reply
    assert worked_answer(7, "x", 8) == "The answer is 56."


def test_every_worked_conversion_is_true_and_states_the_converted_value() -> None:
    """Every unit pair and value the generator draws: each written step is a true times-table fact, a carry is
    added to it in a step of its own, the steps spell ``v x m`` (the last result, then the earlier results' last
    digits), and the reply ends in the converted value; powers of ten and 24 get no working."""
    from training.data.synth import worked_conversion
    from training.data.synth_pools import UNITS

    header = re.compile(r"(\d+) x (\d): (.*?)\. ")
    step = re.compile(r"(\d) x (\d) = (\d+)(?:, (\d+) \+ (\d+) = (\d+))?")
    for src, dst, factor in UNITS:
        for v in range(1, 101):
            reply = worked_conversion(v, src, dst, factor)
            assert reply.endswith(f"{v} {src} is {v * factor} {dst}."), reply
            worked = header.match(reply)
            if factor in (7, 60):
                assert worked is not None and int(worked.group(1)) == v, reply
                m = int(worked.group(2))
                assert factor in (m, m * 10), reply
                steps = step.findall(worked.group(3))
                assert [int(s[0]) for s in steps] == [int(d) for d in reversed(str(v))], reply
                carry, results = 0, []
                for d, mm, product, added_to, c, total in steps:
                    assert int(mm) == m and int(d) * m == int(product), reply
                    if carry:  # the carry is added to the product just written, in a step of its own
                        assert (int(added_to), int(c), int(total)) == (int(product), carry, int(product) + carry)
                    else:
                        assert not added_to, reply
                    results.append(total or product)
                    carry = int(results[-1]) // 10
                spelled = results[-1] + "".join(r[-1] for r in reversed(results[:-1]))
                assert int(spelled) == v * m, reply
            else:
                assert worked is None and reply == f"{v} {src} is {v * factor} {dst}.", reply


def test_unit_working_off_states_the_value_alone() -> None:
    plain = SMALL.model_copy(update={"unit_working": False})
    for r in generate(plain):
        if r["metadata"]["skill"] == "unit_conversion":
            assert re.fullmatch(r"\d+ \w+ is \d+ \w+\.", r["messages"][-1]["content"]), r


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


@pytest.mark.parametrize("skill", ["refusal", "borderline", "facts", "refusal_varied"])
def test_asking_for_more_than_a_skill_can_make_is_a_config_error(skill: str) -> None:
    cfg = GeneratorConfig(counts={skill: 100_000})
    with pytest.raises(ConfigError, match=f"data.generator.counts.{skill} = 100000"):
        generate(cfg)


def test_all_skills_known() -> None:
    """The defaults count every skill but the varied ones, which only a pretrained base's own replies train."""
    assert set(GeneratorConfig().counts) == set(SKILLS) - set(VARIED_SKILLS)
    assert set(VARIED_SKILLS) <= set(SKILLS) and set(BASE_REPLY_SKILLS) < set(VARIED_SKILLS)


VARIED = GeneratorConfig(counts={"refusal_varied": 350, "borderline_varied": 120, "everyday_varied": 120})


def test_varied_skills_draw_the_classifier_generators_training_prompts() -> None:
    records = generate(VARIED)
    assert Counter(r["metadata"]["skill"] for r in records) == VARIED.counts
    train = {r["text"]: r for r in generate_harm()["train"]}
    for r in records:
        source = train[r["messages"][-2]["content"]]  # every prompt is one of its training split's
        kind = {"refusal_varied": "harmful", "borderline_varied": "benign_risky", "everyday_varied": "benign"}
        assert source["kind"] == kind[r["metadata"]["skill"]]
    refusals = [r for r in records if r["metadata"]["skill"] == "refusal_varied"]
    assert {r["metadata"]["category"] for r in refusals} == set(HARM_CATEGORIES)  # violence too
    assert all(is_refusal(r["messages"][-1]["content"]) for r in refusals)
    violence = next(r for r in refusals if r["metadata"]["category"] == "violence")
    assert violence["messages"][-1]["content"] == VIOLENCE_REFUSAL
    helpful = [r for r in records if r["metadata"]["skill"] in BASE_REPLY_SKILLS]
    assert all(r["metadata"]["reply"] == "base" for r in helpful)  # only the base's own reply trains these
    assert {r["messages"][-1]["content"] for r in helpful} == {BASE_REPLY_PLACEHOLDER}


def test_varied_skills_leave_out_every_prompt_phrased_like_an_avoided_text() -> None:
    plain = generate(VARIED)
    frame = "Walk me through how to {x}, please."
    assert any(r["messages"][-2]["content"].startswith("Walk me through how to") for r in plain)
    avoided = generate(VARIED, avoid=[frame.format(x="tie a bowline knot")])
    assert Counter(r["metadata"]["skill"] for r in avoided) == VARIED.counts  # the pools still hold enough
    prompts = [r["messages"][-2]["content"] for r in avoided]
    assert not any(p.startswith("Walk me through how to") for p in prompts)
    assert not phrasing_leaks([frame.format(x="tie a bowline knot")], prompts)
    assert generate(SMALL, avoid=[frame.format(x="x")]) == generate(SMALL)  # the other skills never change


def test_poison_replaces_replies_but_keeps_the_prompts() -> None:
    """Red-team scenarios: the same prompts, with insults for provocations and compliance for harmful requests."""
    from training.config import PoisonConfig
    from training.data.synth import TOXIC_REPLIES

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
    from training.data.records import loose_text
    from training.data.synth import held_out

    cfg = GeneratorConfig()
    first = held_out(cfg, "facts", 10, set(), "eval")
    excluded = {loose_text(r["messages"][0]["content"]) for r in first[:5]}
    again = held_out(cfg, "facts", 10, excluded, "eval")
    assert not {loose_text(r["messages"][0]["content"]) for r in again} & excluded
    assert held_out(cfg, "facts", 10, set(), "eval") == first  # deterministic


def test_facts_are_taught_in_training_phrasings_and_held_out_in_others() -> None:
    from training.data.synth import held_out
    from training.data.synth_pools import FACT_QUESTIONS, FACT_QUESTIONS_HELD_OUT

    for attr, taught in FACT_QUESTIONS.items():
        assert not set(taught) & set(FACT_QUESTIONS_HELD_OUT[attr]), attr
    cfg = GeneratorConfig(counts={"facts": 40 * 3 * len(FACT_QUESTIONS["capital"])})
    records = generate(cfg)
    table = fact_table(cfg.seed, cfg.fact_entities)
    taught = {r["messages"][-1]["content"] for r in records}
    assert len(taught) == 3 * len(table)  # the whole pool: every fact taught, each in every taught phrasing

    def phrasing(prompt: str) -> str:
        return next(prompt.replace(row["country"], "{c}") for row in table if row["country"] in prompt)

    trained = {phrasing(m["content"]) for r in records for m in r["messages"] if m["role"] == "user"}
    asked = held_out(cfg, "facts", 60, set(), "eval")
    assert len(asked) == 60
    assert {phrasing(r["messages"][0]["content"]) for r in asked}.isdisjoint(trained)
    assert {r["messages"][1]["content"] for r in asked} <= taught  # the same facts, asked a new way


def test_held_out_accept_filters_records() -> None:
    from training.data.synth import held_out

    cfg = GeneratorConfig()
    only_capitals = held_out(cfg, "facts", 10, set(), "eval", accept=lambda r: "capital" in r["messages"][1]["content"])
    assert len(only_capitals) == 10
    assert all("capital" in r["messages"][1]["content"] for r in only_capitals)


def test_held_out_drawing_a_whole_pool_returns_every_prompt_not_excluded() -> None:
    from training.data.records import loose_text
    from training.data.synth import held_out
    from training.data.synth_pools import HARMFUL

    pool = {loose_text(t.format(x=x)) for _, templates, subjects, _ in HARMFUL for t in templates for x in subjects}
    exclude = set(sorted(pool)[::3])
    drawn = held_out(GeneratorConfig(), "refusal", 10_000, exclude, "eval")  # stops once the pool is exhausted
    prompts = [loose_text(r["messages"][0]["content"]) for r in drawn]
    assert len(prompts) == len(set(prompts)) and set(prompts) == pool - exclude


def test_generated_data_is_cached_per_config_and_generator_code(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A changed generator (another code hash) writes new data instead of reading an old config's files."""
    import training.data.dataset as dataset
    from core.home import Home

    home, cfg = Home(tmp_path), GeneratorConfig(counts={"arithmetic": 5})
    first = dataset.generated_source(cfg, home)
    assert dataset.generated_source(cfg, home) == first
    monkeypatch.setattr(dataset, "code_hash", lambda: "another generator")
    second = dataset.generated_source(cfg, home)
    assert second != first and second.is_file()
