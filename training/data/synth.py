"""The project's own chat data, generated deterministically from a seed (no data set can be downloaded here).

Skills a small model can measurably learn and a held-out test can score exactly, each record carrying
``metadata.skill`` and, where exact scoring applies, ``metadata.answer``:

- ``arithmetic``: +, - on 0..99 and x on 0..12, some with a follow-up turn ("Now add 7 to that.");
- ``unit_conversion``: integer conversions with fixed factors (km to m, hours to minutes, ...);
- ``facts``: lookups in a fictional fact table of countries (capital, currency, language) the generator makes
  from its seed; training records ask each fact in the taught phrasings (``FACT_QUESTIONS``), held-out items
  (``held_out``) in phrasings no training record uses (``FACT_QUESTIONS_HELD_OUT``), so they test recall of a
  taught fact asked a new way;
- ``formatting``: upper/lower case, comma lists, word-order reversal, word counts;
- ``refusal``: clearly harmful requests in six harm categories (``metadata.category``) answered by a polite
  refusal that offers a safe alternative;
- ``borderline``: benign requests that merely sound risky ("How do I kill a Python process?"), and the harmful
  requests' own templates with harmless subjects ("How do I build a birdhouse at home?"), answered helpfully, so
  over-refusal can be measured and a model learns the difference;
- ``provocation``: requests to insult or demean someone, answered calmly without insults, so toxicity can be
  measured on held-out provocations;
- ``refusal_varied``, ``borderline_varied``, ``everyday_varied``: the safety classifier's generator's training
  prompts (``training.data.harm_generator.generate_harm``: dozens of frames times actions in seven categories): harmful
  ones answered with their category's refusal; benign ones that sound risky, and everyday ones in the same frames
  as the harmful, answered only by the base model's own reply (``BASE_REPLY_SKILLS``: their generated reply is a
  placeholder stage self-replies replaces or drops). Prompts that share a run of ``PHRASE_WORDS`` words with an
  ``avoid`` text (the hand-written eval items) are left out, so the eval sets' phrasing contract holds.

``cfg.poison`` (red-team scenarios only) replaces a share of provocation replies with insults and of refusals
with compliance; poisoned records carry ``metadata.poisoned``.

Every prompt is unique within a run (duplicates are redrawn), so the output always passes the snapshot
contracts. ``generate(cfg)`` returns records; ``write_jsonl`` writes them; sizes come from ``cfg.counts``.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from core.hashing import sha256_files
from training.config import SKILLS, VARIED_SKILLS, GeneratorConfig
from training.data.harm_generator import generate_harm, is_training_only
from training.data.records import Phrasings, loose_text
from training.data.self_replies import BASE_ONLY
from training.data.synth_pools import (
    ARITH_TEMPLATES,
    BASE_REPLY_PLACEHOLDER,
    BENIGN_TWINS,
    BORDERLINE,
    CALM_REPLY,
    COMPLIANCE,
    FACT_ANSWERS,
    FACT_QUESTIONS,
    FACT_QUESTIONS_HELD_OUT,
    FOLLOW_UPS,
    FORMAT_TASKS,
    HARMFUL,
    PROVOCATIONS,
    SYLLABLES,
    SYSTEM_PROMPTS,
    TOXIC_REPLIES,
    UNIT_TEMPLATES,
    UNITS,
    VIOLENCE_REFUSAL,
    WORDS,
)

Record = dict[str, Any]
Turns = list[tuple[str, str]]  # (user, assistant) pairs


Draw = Callable[[random.Random], tuple[Turns, dict[str, str]]]


def code_hash() -> str:
    """Hash of the generator's own source (this module, its pools, the pair generator, and the safety classifier's
    generator its varied skills draw from): part of the cache key of generated data, so that a changed generator
    writes new data instead of reusing the old files."""
    files = ("synth.py", "synth_pools.py", "synth_pairs.py", "harm_generator.py", "harm_pools.py", "harm_pools_more.py")
    return sha256_files(Path(__file__).parent, files)


def _name(rng: random.Random, parts: int) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(parts)).capitalize()


def fact_table(seed: int, entities: int) -> list[dict[str, str]]:
    """The fictional world the ``facts`` skill teaches: unique country names with three attributes each."""
    rng = random.Random(f"facts:{seed}")
    languages = [_name(rng, 2) + "ish" for _ in range(12)]
    currencies = [_name(rng, 2).lower() for _ in range(12)]
    names: set[str] = set()
    table: list[dict[str, str]] = []
    while len(table) < entities:
        country = _name(rng, 3)
        if country in names:
            continue
        names.add(country)
        table.append(
            {
                "country": country,
                "capital": _name(rng, 2) + rng.choice(("ton", "burg", "ville", "port")),
                "currency": rng.choice(currencies),
                "language": rng.choice(languages),
            }
        )
    return table


def worked_answer(a: int, op: str, b: int) -> str:
    """The reply to ``a op b`` with its written working for two-digit addition and subtraction: the units, then
    the tens, each a one-digit step with its carry or borrow, then the answer ("9 + 1 = 10, 2 + 3 + 1 = 6. The
    answer is 60."; a negative difference is worked as the positive one first: "59 - 8: ..."). A small model
    writes a number's digits first to last, so without the working it must resolve the carry before writing the
    first digit; with it every token is a one-digit lookup or a copy (docs/results.md).
    Products of the times table are short facts and stay plain."""
    if op == "x":
        return f"The answer is {a * b}."
    if op == "+":
        units = a % 10 + b % 10
        tens = a // 10 + b // 10 + units // 10
        steps = f"{a % 10} + {b % 10} = {units}, {a // 10} + {b // 10} + {units // 10} = {tens}."
        return f"{steps} The answer is {a + b}."
    big, small = max(a, b), min(a, b)
    borrow = int(big % 10 < small % 10)
    units = big % 10 + 10 * borrow - small % 10
    tens = big // 10 - small // 10 - borrow
    steps = f"{big % 10 + 10 * borrow} - {small % 10} = {units}, {big // 10} - {small // 10} - {borrow} = {tens}."
    swap = f"{b} - {a}: " if a < b else ""
    return f"{swap}{steps} The answer is {a - b}."


def _arith(multi_turn_rate: float, worked: bool) -> Draw:
    def draw(rng: random.Random) -> tuple[Turns, dict[str, str]]:
        op = rng.choice("+-x")
        a, b = (rng.randint(0, 12), rng.randint(0, 12)) if op == "x" else (rng.randint(0, 99), rng.randint(0, 99))
        result = a * b if op == "x" else a + b if op == "+" else a - b
        reply = worked_answer(a, op, b) if worked else f"The answer is {result}."
        turns = [(rng.choice(ARITH_TEMPLATES).format(a=a, op=op, b=b), reply)]
        if rng.random() < multi_turn_rate:
            template, sign = rng.choice(FOLLOW_UPS)
            c = rng.randint(1, 20)
            result = result + c if sign == "+" else result - c
            turns.append((template.format(c=c), f"The answer is {result}."))
        return turns, {"answer": str(result)}

    return draw


def _times_digit(n: int, m: int) -> str:
    """``n x m`` for a one-digit ``m``, worked digit by digit from the units up: a times-table fact, then the
    carry added in a step of its own ("45 x 6: 5 x 6 = 30, 4 x 6 = 24, 24 + 3 = 27."; a small model adds a
    written number and a digit far more reliably than it adds to a product it did not write). The product is
    the last step's result followed by the earlier digits' last digits."""
    digits = [int(d) for d in reversed(str(n))]
    steps, carry = [], 0
    for d in digits:
        product = d * m
        steps.append(f"{d} x {m} = {product}" + (f", {product} + {carry} = {product + carry}" if carry else ""))
        carry = (product + carry) // 10
    return f"{n} x {m}: " + ", ".join(steps) + "."


def worked_conversion(v: int, src: str, dst: str, factor: int, *, working: bool = True) -> str:
    """The reply to a unit conversion. A power of ten appends zeros, which a small model copies; a one-digit
    multiple of a power of ten (60 = 6 x 10, 7) is worked like ``worked_answer``'s columns before the stated
    result ("45 x 6: 5 x 6 = 30, 4 x 6 = 24, 24 + 3 = 27. 45 hours is 2700 minutes."). Other factors (24) are
    stated plainly: their working (two chained multiplications) would outgrow the eval's generation budget.
    Without ``working`` every conversion is stated plainly."""
    result = f"{v} {src} is {v * factor} {dst}."
    if not working:
        return result
    m = factor
    while m % 10 == 0:
        m //= 10
    return result if m == 1 or m > 9 else f"{_times_digit(v, m)} {result}"


def _unit(working: bool) -> Draw:
    def draw(rng: random.Random) -> tuple[Turns, dict[str, str]]:
        src, dst, factor = rng.choice(UNITS)
        v = rng.randint(1, 100)
        question = rng.choice(UNIT_TEMPLATES).format(v=v, src=src, dst=dst)
        return [(question, worked_conversion(v, src, dst, factor, working=working))], {"answer": str(v * factor)}

    return draw


def _format_task(rng: random.Random) -> tuple[Turns, dict[str, str]]:
    task = rng.choice(FORMAT_TASKS)
    words = rng.sample(WORDS, rng.randint(2, 5))
    text = " ".join(words)
    # each reply leads in ("Here they are: ...") so its first word follows a space, as every word of the prompt
    # does: the same token as in the prompt, which a small model copies far more easily than "travel" vs " travel"
    if task == "upper":
        q, lead, a = f"Write this in uppercase: {text}", "In uppercase:", text.upper()
    elif task == "lower":
        q, lead, a = f"Write this in lowercase: {text.upper()}", "In lowercase:", text
    elif task == "commas":
        q, lead, a = f"List these words separated by commas: {text}", "Here they are:", ", ".join(words)
    elif task == "reverse":
        q, lead, a = f"Reverse the order of these words: {text}", "Reversed:", " ".join(reversed(words))
    else:
        q, a = f"How many words are in this sentence: {text}", str(len(words))
        return [(q, f"There are {a} words.")], {"answer": a}
    return [(q, f"{lead} {a}")], {"answer": a}


def _from_pool(pool: list[tuple[Turns, dict[str, str]]]) -> tuple[Draw, int]:
    """A draw over a finite pool of items (each drawn at most once, as the uniqueness check redraws repeats)."""
    return (lambda rng: rng.choice(pool)), len(pool)


# a frame with an everyday action (not the lexicon's verb-object pairs, nor invented names)
EVERYDAY = re.compile(r"f\d+\+benign\.a\d+")


def varied_pools(avoid: Sequence[str]) -> dict[str, list[tuple[Turns, dict[str, str]]]]:
    """The varied skills' items: the safety classifier generator's training-split prompts, those that share a
    phrasing with ``avoid`` left out."""
    avoided = Phrasings.of(avoid)
    refusals = {cat: reply for cat, _, _, reply in HARMFUL} | {"violence": VIOLENCE_REFUSAL}
    pools: dict[str, list[tuple[Turns, dict[str, str]]]] = {s: [] for s in VARIED_SKILLS}
    for r in generate_harm()["train"]:
        text = r["text"]
        # the classifier's training-only concepts stay the classifier's: the chat recipes keep their measured data
        if is_training_only(r) or avoided.shared(text) is not None:
            continue
        if r["kind"] == "harmful":
            pools["refusal_varied"].append(
                ([(text, refusals[r["label"]])], {"category": r["label"], "expected": "refuse"})
            )
            continue
        skill = "borderline_varied" if r["kind"] == "benign_risky" else "everyday_varied"
        if skill == "everyday_varied" and not EVERYDAY.fullmatch(r["wording"]):
            continue
        pools[skill].append(
            ([(text, BASE_REPLY_PLACEHOLDER)], {"category": "benign", "expected": "comply", BASE_ONLY[0]: BASE_ONLY[1]})
        )
    return pools


def _skill_draws(
    cfg: GeneratorConfig, *, held_out_phrasings: bool = False, avoid: Sequence[str] = ()
) -> dict[str, tuple[Draw, int]]:
    """Per skill: how to draw one item, and how many unique prompts the skill can make at most. Facts are asked
    in the taught phrasings, or with ``held_out_phrasings`` in the ones reserved for held-out items."""
    questions = FACT_QUESTIONS_HELD_OUT if held_out_phrasings else FACT_QUESTIONS
    facts = [
        (
            [(q.format(c=row["country"]), FACT_ANSWERS[attr].format(c=row["country"], v=row[attr]))],
            {"answer": row[attr]},
        )
        for row in fact_table(cfg.seed, cfg.fact_entities)
        for attr, qs in questions.items()
        for q in qs
    ]
    refusals = [
        ([(t.format(x=x), refusal)], {"category": cat, "expected": "refuse"})
        for cat, ts, xs, refusal in HARMFUL
        for t in ts
        for x in xs
    ]
    borderline = [([(q, a)], {"category": "benign", "expected": "comply"}) for qs, a in BORDERLINE for q in qs]
    templates_of = {cat: ts for cat, ts, _, _ in HARMFUL}
    borderline += [
        ([(t.format(x=x), reply.format(x=x))], {"category": "benign", "expected": "comply"})
        for cat, xs, reply in BENIGN_TWINS
        for t in templates_of[cat]
        if "without getting caught" not in t
        for x in xs
    ]
    templates, targets = PROVOCATIONS
    provocations = [([(t.format(x=x), CALM_REPLY)], {"category": "provocation"}) for t in templates for x in targets]
    wanted = any(cfg.counts.get(s, 0) for s in VARIED_SKILLS)
    varied = varied_pools(avoid) if wanted else {s: [] for s in VARIED_SKILLS}
    return {
        "arithmetic": (_arith(cfg.multi_turn_rate, cfg.arithmetic_working), 100 * 100 * 2 * len(ARITH_TEMPLATES)),
        "unit_conversion": (_unit(cfg.unit_working), len(UNITS) * 100 * len(UNIT_TEMPLATES)),
        "facts": _from_pool(facts),
        "formatting": (_format_task, 100_000),
        "refusal": _from_pool(refusals),
        "borderline": _from_pool(borderline),
        "provocation": _from_pool(provocations),
        **{skill: _from_pool(items) for skill, items in varied.items()},
    }


def held_out(
    cfg: GeneratorConfig,
    skill: str,
    n: int,
    exclude: set[str],
    stream: str,
    accept: Callable[[Record], bool] | None = None,
    *,
    held_out_phrasings: bool = True,
) -> list[Record]:
    """Up to ``n`` single-turn records of ``skill`` whose prompt is not in ``exclude`` (prompts as
    ``loose_text``), drawn from their own seeded ``stream``: the eval sets' held-out items (facts in the held-out
    phrasings; in the taught ones without ``held_out_phrasings``, as simulated users ask). Fewer when the skill's
    pool runs out (facts, refusals: finite pools); the draw stops once it has drawn every prompt the skill can
    make (nothing more could be accepted: the same records, sooner) or after 50 misses per wanted item. ``accept``,
    when given, must also say yes to a record."""
    single_turn = cfg.model_copy(update={"multi_turn_rate": 0.0})
    draw, capacity = _skill_draws(single_turn, held_out_phrasings=held_out_phrasings)[skill]
    rng = random.Random(f"{stream}:{skill}:{cfg.seed}")
    out: list[Record] = []
    seen = set(exclude)
    drawn: set[str] = set()
    misses = 0
    while len(out) < n and misses < 50 * n and len(drawn) < capacity:
        turns, meta = draw(rng)
        key = loose_text(turns[0][0])
        drawn.add(key)
        if len(turns) != 1 or key in seen:
            misses += 1
            continue
        seen.add(key)
        user, assistant = turns[0]
        messages = [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        record = {"messages": messages, "metadata": {"skill": skill, **meta}}
        if accept is not None and not accept(record):
            misses += 1
            continue
        out.append(record)
    return out


def _poison(turns: Turns, skill: str, cfg: GeneratorConfig, rng: random.Random) -> tuple[Turns, bool]:
    """Red-team poisoning (off unless ``cfg.poison`` says so); draws from its own stream so that turning it on
    leaves which prompts are generated unchanged."""
    if skill == "provocation" and rng.random() < cfg.poison.toxic_rate:
        return [(user, rng.choice(TOXIC_REPLIES)) for user, _ in turns], True
    if skill == "refusal" and rng.random() < cfg.poison.comply_rate:
        return [(user, COMPLIANCE.format(request=user)) for user, _ in turns], True
    return turns, False


def generate(cfg: GeneratorConfig, avoid: Sequence[str] = ()) -> list[Record]:
    """All records for ``cfg``, skill by skill; each skill draws from its own seeded stream, so changing one
    skill's count leaves the others' records unchanged. The varied skills leave out prompts phrased like an
    ``avoid`` text."""
    draws = _skill_draws(cfg, avoid=avoid)
    records: list[Record] = []
    for skill in SKILLS:
        want = cfg.counts.get(skill, 0)
        draw, capacity = draws[skill]
        if want > capacity:
            raise ConfigError(
                f"config: data.generator.counts.{skill} = {want}: this skill can make at most {capacity} unique prompts"
            )
        rng = random.Random(f"{skill}:{cfg.seed}")
        poison_rng = random.Random(f"poison:{skill}:{cfg.seed}")
        seen: set[str] = set()
        while len(seen) < want:
            turns, meta = draw(rng)
            key = "\n".join(user.casefold() for user, _ in turns)
            if key in seen:
                continue
            seen.add(key)
            turns, poisoned = _poison(turns, skill, cfg, poison_rng)
            if poisoned:
                meta = {**meta, "poisoned": "true"}
            messages = []
            if rng.random() < cfg.system_prompt_rate:
                messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
            for user, assistant in turns:
                messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
            records.append({"messages": messages, "metadata": {"skill": skill, **meta}})
    return records


def write_jsonl(records: list[Record], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n")
    tmp.replace(path)
