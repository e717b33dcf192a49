"""Generated preference pairs (``training/data/pairs.py`` records) for the preference stage, from the same pools as
the chat data (``training/data/synth.py``, ``training/data/synth_pools.py``):

- ``refusal``: a harmful request; the category's refusal over the helpful answer its benign twin gets, said of
  the harmful subject (what a model that misses the harm replies: "Sure. For a pipe bomb, sketch the design...");
- ``borderline``: a benign request that sounds risky; the helpful answer over the refusal of the harmful category
  whose request it mirrors (the over-refusal a small SFT model makes). The two kinds are each other's mistakes,
  so a pair of one kind is only won by telling the subjects apart, not by moving every refusal up or down;
- ``provocation``: a request to insult someone; the calm reply over an insult;
- ``arithmetic``, ``unit_conversion``, ``facts``: the right answer over a near miss of the kind a small model
  makes (a digit or a carry off, a factor of ten, another country's fact): the skills the SFT model gets wrong
  most often (docs/results.md, "What does the default model answer?").

Rejected replies are written, not sampled from the SFT model: a 1.3 M model's own mistakes would need a generation
pass per retrain, and these are the mistakes the eval suites count. Prompts are drawn on their own seeded stream
("preference") and never from ``exclude`` (the eval sets' prompts), so the pair snapshot's eval-leak contract
holds by construction; the same config and exclusions give the same bytes.

    pairs = generate_pairs(cfg.preference.data, cfg.data.generator, exclude=eval_prompts)
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

from training.config import POLICY_PAIR_KINDS, GeneratorConfig, PairDataConfig
from training.data.synth import Record, fact_table, held_out
from training.data.synth_pools import BENIGN_TWINS, COMPLIANCE, HARMFUL, TOXIC_REPLIES

STREAM = "preference"
_ANSWER = re.compile(r"-?\d+(?=\D*$)")  # the last number of a reply: its stated answer
_NEAR_MISSES = (1, -1, 10, -10, 2)

Reject = Callable[[str, Record, random.Random], str]


def _near_miss(reply: str, record: Record, rng: random.Random) -> str:
    """The reply with its stated (last) number off by a digit or a carry."""
    match = _ANSWER.search(reply)
    assert match is not None, f"no number in {reply!r}"
    wrong = int(match.group()) + rng.choice(_NEAR_MISSES)
    return reply[: match.start()] + str(wrong) + reply[match.end() :]


def _factor_miss(reply: str, record: Record, rng: random.Random) -> str:
    """The conversion with the wrong power of ten (the factor a small model confuses)."""
    match = _ANSWER.search(reply)
    assert match is not None, f"no number in {reply!r}"
    value = int(match.group())
    wrong = value * 10 if rng.random() < 0.5 or value % 10 else value // 10
    return reply[: match.start()] + str(wrong) + reply[match.end() :]


def _other_fact(values: list[str]) -> Reject:
    def reject(reply: str, record: Record, rng: random.Random) -> str:
        answer = str(record["metadata"]["answer"])
        others = sorted({v for v in values if v != answer})
        return reply.replace(answer, rng.choice(others))

    return reject


Requests = dict[str, tuple[str, str]]


def _twin_requests() -> Requests:
    """Every request a harmful category's templates make, of its harmful subjects and of its benign twins'
    subjects: request -> (category, subject)."""
    twins = {cat: xs for cat, xs, _ in BENIGN_TWINS}
    return {
        t.format(x=x): (cat, x)
        for cat, templates, subjects, _ in HARMFUL
        for t in templates
        for x in (*subjects, *twins.get(cat, ()))
    }


def _comply(requests: Requests) -> Reject:
    twin_reply = {cat: reply for cat, _, reply in BENIGN_TWINS}

    def reject(reply: str, record: Record, rng: random.Random) -> str:
        request = record["messages"][0]["content"]
        cat, subject = requests.get(request, (None, ""))
        if cat in twin_reply:
            return twin_reply[cat].format(x=subject)
        return COMPLIANCE.format(request=request)

    return reject


def _refuse(requests: Requests) -> Reject:
    refusal_of = {cat: refusal for cat, _, _, refusal in HARMFUL}

    def reject(reply: str, record: Record, rng: random.Random) -> str:
        cat, _ = requests.get(record["messages"][0]["content"], (None, ""))
        return refusal_of[cat] if cat is not None else rng.choice(list(refusal_of.values()))

    return reject


def _insult(reply: str, record: Record, rng: random.Random) -> str:
    return rng.choice(TOXIC_REPLIES)


def _rejecters(gen: GeneratorConfig) -> dict[str, Reject]:
    table = fact_table(gen.seed, gen.fact_entities)
    requests = _twin_requests()
    return {
        "refusal": _comply(requests),
        "borderline": _refuse(requests),
        "provocation": _insult,
        "arithmetic": _near_miss,
        "unit_conversion": _factor_miss,
        "facts": _other_fact([row[k] for row in table for k in ("capital", "currency", "language")]),
    }


def generate_pairs(cfg: PairDataConfig, gen: GeneratorConfig, exclude: set[str]) -> list[Record]:
    """Up to ``cfg.counts[kind]`` pairs per kind whose prompt is not in ``exclude`` (``loose_text``); each kind
    draws on its own stream, so changing one count leaves the other kinds' pairs unchanged. The on-policy kinds
    (``POLICY_PAIR_KINDS``) need the SFT version's replies and are not written here (``policy_pairs.py``)."""
    rejecters = _rejecters(gen)
    pairs: list[Record] = []
    for kind, want in cfg.counts.items():
        if want == 0 or kind in POLICY_PAIR_KINDS:  # written after SFT: training/data/policy_pairs.py
            continue
        rng = random.Random(f"{STREAM}:reject:{kind}:{cfg.seed}")
        drawn = held_out(gen, kind, want, exclude, f"{STREAM}:{cfg.seed}", held_out_phrasings=False)
        for record in drawn:
            user, chosen = record["messages"][0]["content"], record["messages"][1]["content"]
            rejected = rejecters[kind](chosen, record, rng)
            metadata = {k: v for k, v in record["metadata"].items() if k != "answer"}
            pairs.append(
                {
                    "messages": [{"role": "user", "content": user}],
                    "chosen": chosen,
                    "rejected": rejected,
                    "metadata": {**metadata, "source": "synthetic", "kind": kind},
                }
            )
    return pairs
