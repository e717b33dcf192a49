"""On-policy preference pairs (training/data/policy_pairs.py): which prompts make a pair, with which replies."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

from core.refusal import is_refusal
from training.config import PairDataConfig, SnapshotConfig
from training.data.harm_generator import generate_harm
from training.data.pairs import parse_pair
from training.data.policy_pairs import Drawn, contrast_pairs, draw, wanted
from training.data.records import loose_text
from training.data.self_replies import GreedyChat

Messages = list[dict[str, str]]
REFUSAL = "I'm sorry, but I can't help with that."


@dataclass(frozen=True)
class Reply:
    text: str
    finished: bool = True


class Scripted:
    """Replies by prompt (``default`` for the rest); records what it was asked."""

    def __init__(self, replies: dict[str, Reply], default: Callable[[str], Reply]) -> None:
        self.replies, self.default = replies, default
        self.asked: list[str] = []

    def greedy(self, conversations: Sequence[Messages], max_tokens: int) -> list[Reply]:
        users = [c[-1]["content"] for c in conversations]
        self.asked += users
        return [self.replies.get(u, self.default(u)) for u in users]


def opener(model: Scripted) -> Callable[[], AbstractContextManager[GreedyChat]]:
    @contextmanager
    def open_chat() -> Iterator[GreedyChat]:
        yield model

    return open_chat


def cfg(**counts: int) -> PairDataConfig:
    return PairDataConfig(counts=counts, seed=3)


def test_draws_training_split_prompts_of_each_kind_outside_the_exclusions() -> None:
    train = {(r["text"], r["kind"]) for r in generate_harm()["train"]}
    c = cfg(refusal_varied=30, borderline_varied=20, everyday_varied=10, refusal=5)
    drawn = draw(c, avoid=[], exclude=set())
    assert wanted(c) == {"refusal_varied": 30, "borderline_varied": 20, "everyday_varied": 10}
    kinds = {"refusal_varied": "harmful", "borderline_varied": "benign_risky", "everyday_varied": "benign"}
    assert [d.kind for d in drawn] == ["refusal_varied"] * 30 + ["borderline_varied"] * 20 + ["everyday_varied"] * 10
    assert all((d.prompt, kinds[d.kind]) in train for d in drawn)
    assert all((d.refusal is not None) == (d.kind == "refusal_varied") for d in drawn)
    assert all(is_refusal(d.refusal) for d in drawn if d.refusal)
    assert draw(c, avoid=[], exclude=set()) == drawn  # seeded

    excluded = {loose_text(d.prompt) for d in drawn[:5]}
    again = draw(c, avoid=[], exclude=excluded)
    assert not {loose_text(d.prompt) for d in again} & excluded and len(again) == 60
    # a phrasing to avoid removes every prompt sharing five words with it
    avoided = draw(c, avoid=[drawn[0].prompt], exclude=set())
    assert drawn[0].prompt not in {d.prompt for d in avoided}


def test_pairs_contrast_the_policys_own_mistakes_and_ask_the_base_only_when_needed() -> None:
    harmful = [Drawn("refusal_varied", f"harmful {i}", "weapons", REFUSAL + " Weapons.") for i in range(3)]
    benign = [Drawn("borderline_varied", f"benign {i}", "benign") for i in range(5)]
    policy = Scripted(
        {
            "harmful 0": Reply("Sure, here is how: first get the parts."),  # complies: its own mistake is rejected
            "harmful 1": Reply(REFUSAL),  # refuses: the base's compliance is rejected
            "harmful 2": Reply(REFUSAL),  # and the base refuses too: no pair
            "benign 0": Reply(REFUSAL),  # over-refusal: the base's answer over it
            "benign 1": Reply("Here is a plain answer."),  # answers already: no pair
            "benign 2": Reply(REFUSAL),  # the base refuses too: no pair
            "benign 3": Reply(REFUSAL),  # the base's answer is cut with no sentence to keep: no pair
            "benign 4": Reply(""),  # empty: no pair
        },
        default=lambda u: Reply("unused"),
    )
    base = Scripted(
        {
            "harmful 1": Reply("To do that you would mix the following."),
            "harmful 2": Reply("I can't help with that."),
            "benign 0": Reply(
                "A helpful answer that is long enough to keep. And a sentence cut in the mid", finished=False
            ),
            "benign 2": Reply("I'm sorry, I cannot do that."),
            "benign 3": Reply("no sentence end here at all", finished=False),
        },
        default=lambda u: Reply(f"base: {u}"),
    )
    pairs, summary = contrast_pairs(harmful + benign, policy=opener(policy), base=opener(base), cfg=cfg())
    got = {p["messages"][0]["content"]: (p["chosen"], p["rejected"], p["metadata"]) for p in pairs}
    assert set(got) == {"harmful 0", "harmful 1", "benign 0"}
    assert got["harmful 0"][:2] == (REFUSAL + " Weapons.", "Sure, here is how: first get the parts.")
    assert got["harmful 0"][2]["rejected_from"] == "policy" and got["harmful 0"][2]["category"] == "weapons"
    assert got["harmful 1"][:2] == (REFUSAL + " Weapons.", "To do that you would mix the following.")
    assert got["harmful 1"][2]["rejected_from"] == "base"
    assert got["benign 0"][:2] == (
        "A helpful answer that is long enough to keep.",
        REFUSAL,
    )  # trimmed to its last sentence
    assert got["benign 0"][2] == {
        "source": "synthetic",
        "kind": "borderline_varied",
        "category": "benign",
        "chosen_from": "base",
        "rejected_from": "policy",
    }
    # the policy answered every prompt; the base only those that could make a pair
    assert policy.asked == [d.prompt for d in harmful + benign]
    assert base.asked == ["harmful 1", "harmful 2", "benign 0", "benign 2", "benign 3"]
    assert summary == {
        "drawn": {"refusal_varied": 3, "borderline_varied": 5},
        "paired": {"refusal_varied": 2, "borderline_varied": 1},
        "rejected_from": {"policy": 2, "base": 1},
        "unpaired": {
            "benign_answered_by_policy": 1,
            "benign_base_refusal": 1,
            "benign_base_truncated": 1,
            "benign_policy_empty": 1,
            "harmful_refused_by_both": 1,
        },
    }
    # every pair is a valid pair record
    for p in pairs:
        parse_pair(p, SnapshotConfig())


def test_no_base_engine_starts_when_no_prompt_needs_it() -> None:
    drawn = [Drawn("everyday_varied", "benign", "benign")]
    policy = Scripted({}, default=lambda u: Reply("An answer."))

    @contextmanager
    def no_base() -> Iterator[GreedyChat]:
        raise AssertionError("the base engine started")
        yield  # pragma: no cover

    pairs, summary = contrast_pairs(drawn, policy=opener(policy), base=no_base, cfg=cfg())
    assert pairs == [] and summary["unpaired"] == {"benign_answered_by_policy": 1}
