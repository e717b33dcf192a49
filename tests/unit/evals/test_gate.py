"""The gate decision, table-driven: floors, non-regression on a paired bootstrap, missing metrics, no champion."""

from __future__ import annotations

import pytest
from support.report_helpers import metric, report

from core.errors import ConfigError
from evals.gate import BootstrapSpec, GatePolicy, Rule, decide, paired_bootstrap, render_markdown
from evals.report import Screened


def policy(**rules: Rule) -> GatePolicy:
    return GatePolicy(name="test", rules={k.replace("__", "/"): v for k, v in rules.items()})


def test_floors_alone_decide_without_a_champion() -> None:
    rep = report(metric("safety/refusal_rate", [1, 1, 1, 0]), metric("toxicity/toxic_share", [0, 0, 0, 1], hib=False))
    d = decide(rep, None, policy(safety__refusal_rate=Rule(min=0.7), toxicity__toxic_share=Rule(max=0.1)))
    assert not d.passed
    assert d.failing == ["toxicity/toxic_share"]
    assert "0.250 > max 0.1 (floor)" in d.verdicts[1].reason
    assert d.verdicts[0].verdict == "pass" and d.champion is None
    assert "toxicity/toxic_share" in d.summary


def test_every_rule_passing_passes() -> None:
    rep = report(metric("safety/refusal_rate", [1, 1, 1, 1]))
    d = decide(rep, None, policy(safety__refusal_rate=Rule(min=0.9, tolerance=0.05)))
    assert d.passed and d.failing == [] and d.summary.startswith("passed")


def test_a_metric_the_report_lacks_fails() -> None:
    d = decide(report(metric("a/x", [1.0])), None, policy(safety__refusal_rate=Rule(min=0.5)))
    assert not d.passed and "not measured" in d.verdicts[0].reason


def test_clear_regression_vs_champion_fails_with_the_interval() -> None:
    champ = report(metric("q/acc", [1.0] * 100), model="chat/1")
    cand = report(metric("q/acc", [1.0] * 60 + [0.0] * 40))
    d = decide(cand, champ, policy(q__acc=Rule(min=0.5, tolerance=0.05)))
    v = d.verdicts[0]
    assert not d.passed and v.verdict == "fail"
    assert "regressed vs chat/1" in v.reason
    assert v.ci_high is not None and v.ci_high < -0.05
    assert v.delta == pytest.approx(-0.4) and v.n_paired == 100 and v.champion_value == 1.0


def test_a_small_noisy_drop_is_not_a_regression() -> None:
    """Point estimate below -tolerance but the interval reaches above it: noise, not a regression."""
    champ = report(metric("q/acc", [1, 0] * 10), model="chat/1")
    cand = report(metric("q/acc", [1, 0] * 9 + [0, 0]))
    d = decide(cand, champ, policy(q__acc=Rule(tolerance=0.02)))
    v = d.verdicts[0]
    assert v.verdict == "pass" and "within noise" in v.reason
    assert v.ci_low is not None and v.ci_low < -0.02 < (v.ci_high or 0)


def test_lower_is_better_regression_is_oriented() -> None:
    champ = report(metric("t/share", [0.0] * 50, hib=False), model="chat/1")
    cand = report(metric("t/share", [1.0] * 25 + [0.0] * 25, hib=False))
    d = decide(cand, champ, policy(t__share=Rule(max=0.9, tolerance=0.05)))
    assert not d.passed and d.verdicts[0].ci_high is not None and d.verdicts[0].ci_high < 0
    better = decide(champ, cand, policy(t__share=Rule(max=0.9, tolerance=0.05)))
    assert better.passed and (better.verdicts[0].ci_low or 0) > 0


def test_champion_on_other_items_fails_closed() -> None:
    champ = report(metric("q/acc", [1.0] * 10), model="chat/1", sets="b" * 64)
    d = decide(report(metric("q/acc", [1.0] * 10)), champ, policy(q__acc=Rule(tolerance=0.05)))
    assert not d.passed and "other items" in d.verdicts[0].reason


def test_rules_without_tolerance_ignore_the_champion() -> None:
    champ = report(metric("q/acc", [1.0] * 10), model="chat/1")
    d = decide(report(metric("q/acc", [0.6] * 10)), champ, policy(q__acc=Rule(min=0.5)))
    assert d.passed and d.verdicts[0].champion_value is None


def test_policy_direction_must_match_the_metric() -> None:
    with pytest.raises(ConfigError, match="lower-is-better; give it 'max'"):
        decide(report(metric("t/share", [0.0], hib=False)), None, policy(t__share=Rule(min=0.1)))
    with pytest.raises(ValueError, match="not both"):
        Rule(min=0.1, max=0.2)


def test_paired_bootstrap_respects_weights_and_is_reproducible() -> None:
    spec = BootstrapSpec(samples=500, seed=3)
    a = metric("q/bpb", [1.0, 3.0], hib=False, weights=[3.0, 1.0])
    b = metric("q/bpb", [2.0, 2.0], hib=False, weights=[3.0, 1.0])
    point, low, high = paired_bootstrap(a, b, ["i0", "i1"], spec)
    assert point == pytest.approx(2.0 - 1.5)  # weighted 1.5 vs 2.0, lower is better: +0.5 improvement
    assert (point, low, high) == paired_bootstrap(a, b, ["i0", "i1"], spec)
    assert low <= point <= high


def test_decision_is_deterministic_and_renders() -> None:
    champ = report(metric("q/acc", [1, 0, 1, 1] * 10), model="chat/1")
    cand = report(metric("q/acc", [1, 1, 0, 1] * 10))
    pol = policy(q__acc=Rule(min=0.5, tolerance=0.05))
    first, second = decide(cand, champ, pol), decide(cand, champ, pol)
    assert first == second
    md = render_markdown(first, cand)
    assert "# Gate PASSED: chat/2" in md and "| q/acc | ↑ | 0.750 |" in md and "champion `chat/1`" in md
    assert first.to_json()["failing"] == []
    assert "as the endpoint serves it" not in md  # the model alone
    counts = {"q": {"asked": 40, "blocked": 9, "stopped": 1}}
    screened = Screened(filters="classifier safety-classifier/3", suites=counts)
    served = cand.model_copy(update={"served": screened})
    md = render_markdown(decide(served, champ, pol), served)
    assert "- judged as the endpoint serves it: classifier safety-classifier/3" in md, md
    assert "- the filters: q 9 of 40 blocked, 1 stopped" in md, md


def test_a_floor_failure_still_reports_the_champion_comparison() -> None:
    champ = report(metric("q/acc", [1.0] * 20), model="chat/1")
    d = decide(report(metric("q/acc", [0.0] * 20)), champ, policy(q__acc=Rule(min=0.5, tolerance=0.05)))
    v = d.verdicts[0]
    assert v.verdict == "fail" and v.champion_value == 1.0 and v.delta == -1.0
    assert "(floor)" in v.reason and "regressed vs chat/1" in v.reason


def test_floor_margins_in_standard_errors_on_the_passing_side() -> None:
    from evals.gate import Measurement, floor_margins

    pol = policy(safety__refusal_rate=Rule(min=0.8), toxicity__toxic_share=Rule(max=0.1), a__b=Rule(tolerance=0.1))
    m = Measurement(
        cpu="test avx2",
        dtype="float32",
        metrics={"safety/refusal_rate": (0.96, 0.02), "toxicity/toxic_share": (0.02, 0.01)},
    )
    margins = {x.metric: x.margin_se for x in floor_margins(pol, [m])}
    assert margins == pytest.approx({"safety/refusal_rate": 8.0, "toxicity/toxic_share": 8.0})  # a/b has no bound
    below = Measurement(
        cpu="x", dtype="bfloat16", metrics={"safety/refusal_rate": (0.7, 0.05), "toxicity/toxic_share": (0.2, 0.05)}
    )
    assert [x.margin_se for x in floor_margins(pol, [below])] == pytest.approx([-2.0, -2.0])
    with pytest.raises(ConfigError, match="lacks toxicity/toxic_share"):
        floor_margins(pol, [Measurement(cpu="x", dtype="float32", metrics={"safety/refusal_rate": (0.9, 0.1)})])
    with pytest.raises(ValueError, match="stderr must be > 0"):
        Measurement(cpu="x", dtype="float32", metrics={"safety/refusal_rate": (1.0, 0.0)})
