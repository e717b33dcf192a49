"""The classifier canary's decision on paired judgements: hold until enough prompts, promote within the limits,
roll back as soon as a rate is past its limit by z standard errors (extra blocks, missed blocks, blocks users
dispute more than the champion's), and roll back a canary still over a limit at max_requests."""

from __future__ import annotations

from monitoring.classifier_canary import CanaryRow, analyze
from monitoring.config import ClassifierCanaryPolicy

CHAMP, CANARY = "safety-classifier/5", "safety-classifier/6"
POLICY = ClassifierCanaryPolicy(min_requests=300, max_requests=2000)


def rows(n: int, *, extra: int = 0, missed: int = 0, both: int = 0, canary_share: float = 0.5) -> list[CanaryRow]:
    """``n`` prompts judged by both: ``extra`` blocked by the canary alone, ``missed`` by the champion alone,
    ``both`` by both; the canary decides every 1/canary_share-th row."""
    out = []
    for i in range(n):
        canary_blocks = i < extra or extra + missed <= i < extra + missed + both
        champ_blocks = extra <= i < extra + missed + both
        by_canary = (i % round(1 / canary_share)) == 0
        rule = {True: "classifier.weapons", False: None}
        decided, shadow = (CANARY, CHAMP) if by_canary else (CHAMP, CANARY)
        d_blocks, s_blocks = (canary_blocks, champ_blocks) if by_canary else (champ_blocks, canary_blocks)
        out.append(CanaryRow(decided, rule[d_blocks], shadow, rule[s_blocks] or "passed"))
    return out


def test_it_holds_until_min_requests_then_promotes_within_the_limits() -> None:
    held = analyze(rows(100, both=10), champion=CHAMP, canary=CANARY, policy=POLICY)
    assert held.action == "hold" and "100 of 300" in held.reason
    ok = analyze(rows(400, both=40, extra=2, missed=1), champion=CHAMP, canary=CANARY, policy=POLICY)
    assert ok.action == "promote" and ok.paired == 400
    assert (ok.extra.k, ok.missed.k) == (2, 1) and ok.stats()["extra_block_rate"] == 0.005


def test_extra_blocks_past_the_limit_by_four_standard_errors_roll_back_before_min_requests() -> None:
    v = analyze(rows(200, extra=20), champion=CHAMP, canary=CANARY, policy=POLICY)  # 0.10, se 0.022
    assert v.action == "rollback" and "extra blocks 20/200" in v.reason and "standard errors" in v.reason


def test_missed_blocks_roll_back_too() -> None:
    v = analyze(rows(500, missed=30, both=10), champion=CHAMP, canary=CANARY, policy=POLICY)
    assert v.action == "rollback" and "missed blocks 30/500" in v.reason


def test_over_a_limit_but_not_proven_holds_then_rolls_back_at_max_requests() -> None:
    v = analyze(rows(400, extra=8), champion=CHAMP, canary=CANARY, policy=POLICY)  # 0.02 > 0.01, se 0.007
    assert v.action == "hold" and "not yet by 4 standard errors" in v.reason
    late = analyze(rows(2000, extra=30), champion=CHAMP, canary=CANARY, policy=POLICY)  # 0.015, se 0.0027
    assert late.action == "rollback" and "still over a limit after 2000" in late.reason


def test_blocks_users_dispute_more_than_the_champions_roll_back() -> None:
    paired = rows(400, both=80)
    rated = []
    for r in paired:
        disputed = r.decided_rule is not None and r.decided_by == CANARY
        rated.append(CanaryRow(r.decided_by, r.decided_rule, r.shadow, r.shadow_rule, -1 if disputed else None))
    v = analyze(rated, champion=CHAMP, canary=CANARY, policy=POLICY)
    assert v.action == "rollback" and "disputed blocks" in v.reason
    assert v.disputed_canary.k == v.disputed_canary.n == 40 and v.disputed_champion.k == 0


def test_rows_of_other_versions_and_fail_closed_blocks_do_not_count() -> None:
    other = [CanaryRow("safety-classifier/4", "classifier.weapons", CHAMP, "passed")] * 50
    unavailable = [CanaryRow(CANARY, "classifier.unavailable", CHAMP, "passed")] * 5
    v = analyze(other + unavailable + rows(300), champion=CHAMP, canary=CANARY, policy=POLICY)
    assert v.paired == 305 and v.extra.k == 0 and v.action == "promote"
