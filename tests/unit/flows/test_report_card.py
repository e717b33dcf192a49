"""The report card ``lifecycle run`` writes of itself (flows/report_card.py), from a hand-made run summary: the
outcome and the champion, every stage's time, the model against the gate's floors and its references, the versions
and the machine."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from core.home import Home
from evals.gate import MetricVerdict
from flows.report_card import champion, report_card, report_card_path
from flows.summaries import GateSummary, RetrainSummary, RolloutSummary, RunEnvironment, RunSummary, TrainSummary

STARTED = datetime(2026, 11, 26, 9, 30, 5, tzinfo=UTC)


def train(version: str = "2") -> TrainSummary:
    return TrainSummary(
        flow_run_id="flow-1",
        snapshot="a" * 64,
        snapshot_counts={"train": 9600, "validation": 400},
        base_model="/h/models/base/k",
        base_model_version="chat-base/1",
        base_model_metrics={},
        model="chat",
        version=version,
        lineage={"config_hash": "c" * 64, "git_sha": "d" * 40, "preference_snapshot": "e" * 64},
        metrics={},
        seconds={"snapshot": 2.0, "base_model": 221.6, "finetune": 96.4, "register": 3.0, "preference": 28.8},
        sft_parent="chat/1",
    )


def gate(passed: bool = True, version: str = "2") -> GateSummary:
    exact = MetricVerdict("quality/exact_match", True, 0.725, "pass", "0.725 >= 0.43", floor=0.43)
    bpb = MetricVerdict("quality/bits_per_byte", False, 0.2, "pass", "0.200 <= 0.65", floor=0.65)
    if not passed:
        exact = replace(exact, value=0.1, verdict="fail", reason="0.100 < 0.43")
    compliance_row = {
        "metric": "over_refusal/compliance_rate",
        "value": 0.917,
        "reference_value": 0.8,
        "improvement": 0.117,
        "ci_low": 0.058,
        "ci_high": 0.175,
        "n_paired": 120,
        "direction": "better",
    }
    return GateSummary(
        flow_run_id="flow-2",
        model="chat",
        version=version,
        passed=passed,
        summary="passed 2 rules" if passed else "failed: quality/exact_match 0.100 < 0.43",
        failing=[] if passed else ["quality/exact_match"],
        champion=None,
        policy="default",
        eval_sets="f" * 64,
        run_id="run-9",
        metrics={
            "quality/exact_match": exact.value or 0.0,
            "quality/exact_match.arithmetic": 0.95,
            "quality/bits_per_byte": 0.2,
            "over_refusal/compliance_rate": 0.917,
        },
        seconds_per_suite={"quality": 10.0},
        report_dir="/h/reports/gates/chat-2",
        references=[{"tag": "sft_parent", "ref": "chat/1", "rows": [compliance_row]}],
        verdicts=[exact, bpb],
        stderrs={"quality/exact_match": 0.035},
        seconds=51.7,
    )


def rollout(outcome: str = "promoted", version: str = "2") -> RolloutSummary:
    return RolloutSummary("chat", version, outcome, [], {"champion": "2"}, {"sent": 240}, 84.0)


ENV = RunEnvironment(
    cpu="AMD EPYC 7B13",
    isa_class="avx2 kernels",
    cores=2,
    python="3.11.9",
    packages={"torch": "2.13.0+cpu", "vllm": "0.32.0", "deepspeed": "0.19.8", "mlflow": "3.17.2", "prefect": "3.7.7"},
)


def run(**changes: object) -> RunSummary:
    fields: dict[str, object] = {
        "train": train(),
        "gate": gate(),
        "rollout": rollout(),
        "drift": {"drift": {"seconds": 5.1}},
        "seconds": 500.7,
        "started_at": STARTED,
        "environment": ENV,
    }
    return RunSummary(**{**fields, **changes})  # type: ignore[arg-type]


def row(card: str, start: str) -> str:
    (line,) = [ln for ln in card.splitlines() if ln.startswith(start)]
    return line


def test_the_card_names_the_outcome_the_champion_the_time_and_the_machine() -> None:
    card = report_card(run())
    assert card.startswith("# lifecycle run, 2026-11-26 09:30:05 UTC\n")
    assert "- **Result**: chat/2 (base chat-base/1, SFT parent chat/1): gate passed, rollout promoted" in card
    assert "- **Champion**: chat/2 (promoted in this run)" in card
    assert "- **Took**: 500.7 s (8.3 min)" in card
    assert "- **Machine**: AMD EPYC 7B13 (avx2 kernels), 2 cores" in card


def test_every_stage_has_its_time_and_the_rest_is_what_they_leave_of_the_total() -> None:
    card = report_card(run())
    assert row(card, "| base model (") == "| base model (tokenizer + pretraining, or found) | 221.6 | 44.3% |"
    assert row(card, "| fine-tune").startswith("| fine-tune (DeepSpeed ranks, export check) | 96.4 |")
    assert row(card, "| preference stage").split(" | ")[1] == "28.8"
    assert row(card, "| gate (chat/2").split(" | ")[1] == "51.7"
    assert row(card, "| gateway start").split(" | ")[1] == "84.0"
    assert row(card, "| drift check").split(" | ")[1] == "5.1"
    stages = 2.0 + 221.6 + 96.4 + 3.0 + 28.8 + 51.7 + 84.0 + 5.1
    assert row(card, "| the rest").split(" | ")[1] == f"{500.7 - stages:.1f}"
    assert row(card, "| **total**") == "| **total** | **500.7** | 100% |"


def test_the_model_is_shown_against_the_gate_floors_and_its_references() -> None:
    card = report_card(run())
    assert "## chat/2 against the gate" in card
    head = row(card, "| metric |")
    assert head == ("| metric | chat/2 | gate floor | verdict | chat/1 (sft parent): value, change [CI] |"), head
    assert row(card, "| quality/exact_match |") == "| quality/exact_match | 0.725 ± 0.035 | ≥ 0.43 | pass | - |"
    assert row(card, "| quality/bits_per_byte |") == "| quality/bits_per_byte | 0.200 | ≤ 0.65 | pass | - |"
    assert row(card, "| quality/exact_match.arithmetic |").startswith("| quality/exact_match.arithmetic | 0.950 | - |")
    assert row(card, "| over_refusal/compliance_rate |").endswith("| 0.800, +0.117 [+0.058, +0.175] better |")


def test_a_failed_gate_says_why_and_leaves_the_champion() -> None:
    card = report_card(run(gate=gate(passed=False), rollout=None, drift=None))
    assert "gate FAILED, rollout stopped at the gate" in card
    assert "- **Champion**: unchanged (the gate stopped chat/2)" in card
    assert "| quality/exact_match | 0.100 ± 0.035 | ≥ 0.43 | **fail**: 0.100 < 0.43 |" in card
    assert "gateway start" not in card and "drift check" not in card


def test_a_retrain_gets_its_own_result_gate_table_and_champion() -> None:
    retrained = RetrainSummary("b" * 64, train("3"), gate(version="3"), rollout("promoted", "3"))
    retrained.rollout.aliases["champion"] = "3"  # type: ignore[union-attr]
    summary = run(retrain=retrained)
    card = report_card(summary)
    assert "- **Retrained**: chat/3 (base chat-base/1, SFT parent chat/1): gate passed, rollout promoted" in card
    assert champion(summary) == "chat/3 (promoted in this run)"
    assert "## chat/3 against the gate" in card
    assert row(card, "| retrained version") == f"| retrained version | chat/3 on snapshot `{'a' * 16}` |"


def test_a_quantized_variant_gets_its_stage_times_and_its_gate_against_its_parent() -> None:
    variant = replace(gate(version="3"), champion="chat/2", seconds=40.5)
    card = report_card(run(quantized=variant, quantize_seconds=12.25, seconds=600.0))
    assert row(card, "| quantize into chat/3").split(" | ")[1] == "12.2"
    assert row(card, "| gate (chat/3 against its parent)").split(" | ")[1] == "40.5"
    assert "## chat/3, quantized from chat/2, against it" in card
    stages = 2.0 + 221.6 + 96.4 + 3.0 + 28.8 + 51.7 + 12.25 + 40.5 + 84.0 + 5.1
    assert row(card, "| the rest").split(" | ")[1] == f"{600.0 - stages:.1f}"
    assert "quantize" not in report_card(run())


def test_a_champion_the_run_did_not_replace_is_named_as_kept() -> None:
    kept = rollout("rolled-back")
    kept.aliases["champion"] = "1"
    assert champion(run(rollout=kept)) == "chat/1 (kept: this run's version did not replace it)"


def test_versions_packages_and_where_the_card_goes() -> None:
    card = report_card(run())
    for line in (
        "| model version | chat/2 (SFT parent chat/1) |",
        "| base model | chat-base/1 |",
        f"| data snapshot | `{'a' * 16}` (train 9600, validation 400) |",
        f"| preference pairs | `{'e' * 16}` |",
        f"| eval sets | `{'f' * 16}` |",
        "| gate policy | default |",
        f"| code (git) | `{'d' * 40}` |",
        "| torch | 2.13.0+cpu |",
        "| vllm | 0.32.0 |",
        "| deepspeed | 0.19.8 |",
        "| mlflow | 3.17.2 |",
        "| prefect | 3.7.7 |",
    ):
        assert line in card, line
    path = report_card_path(Home(Path("/h")), STARTED)
    assert path == Path("/h/reports/run-20261126T093005/report.md")
