"""Offline/online parity's pure parts: the comparison and the prompts it asks."""

from __future__ import annotations

from evals.parity import parity, parity_prompts


def test_answers_equal_up_to_surrounding_whitespace_and_mismatches_are_kept() -> None:
    report = parity(["a", "b", "c"], ["Paris.", " 4", "blue"], ["Paris.\n", "4", "Paris Paris Paris"], max_tokens=8)
    assert (report.items, report.equal) == (3, 2) and report.rate == 2 / 3
    assert report.mismatches == [{"prompt": "c", "offline": "blue", "online": "Paris Paris Paris"}]
    assert report.to_json()["rate"] == 2 / 3


def test_prompts_interleave_every_group_and_are_unique() -> None:
    prompts = parity_prompts(24)
    assert len(prompts) == len(set(prompts)) == 24
    assert "What's France's capital city?" in prompts[:8]  # facts come first, then the other groups in turn


def test_answers_the_endpoints_safety_filter_gave_are_listed_not_compared() -> None:
    # the gateway's own answer to a prompt it blocked (finish_reason content_filter) is not the engine's
    report = parity(["a", "b"], ["Paris.", "Call a doctor."], ["Paris.", "I can't help."], max_tokens=8, filtered=["b"])
    assert (report.items, report.compared, report.equal, report.mismatches) == (2, 1, 1, [])
    assert report.filtered == ["b"] and report.rate == 1.0
    everything = parity(["a"], ["x"], ["y"], max_tokens=8, filtered=["a"])
    assert everything.compared == 0 and everything.rate == 0.0  # nothing compared is no evidence of parity
