"""Shipped suites, tasks and gate policies load, declare directions, and agree with each other."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import ConfigError
from evals.config import SUITES_DIR, TASKS_DIR, load_suite
from evals.gate import floor_margins, load_policy
from evals.harm import DIRECTIONS as HARM_DIRECTIONS
from flows.config import CONFIG_DIR

POLICIES = sorted((CONFIG_DIR / "gates").glob("*.yaml"))
SUITES = {p.stem: load_suite(p.stem) for p in sorted(SUITES_DIR.glob("*.yaml"))}


def test_the_suites_ship() -> None:
    # the generator's four, and the pretrained model's three on hand-written items (configs/smollm2.yaml)
    assert set(SUITES) == {"quality", "toxicity", "safety", "over_refusal", "harmful", "benign_risky", "retention"}
    for name, suite in SUITES.items():
        assert suite.name == name and suite.metrics


@pytest.mark.parametrize("path", POLICIES, ids=lambda p: p.name)
def test_every_policy_rule_names_a_suite_metric_in_its_direction(path: Path) -> None:
    policy = load_policy(path)
    declared = {f"{s.name}/{k}": spec.higher_is_better for s in SUITES.values() for k, spec in s.metrics.items()}
    declared |= HARM_DIRECTIONS  # the safety classifier's metrics (evals/harm.py)
    for name, rule in policy.rules.items():
        assert name in declared, f"{path.name}: {name} is not a metric of any suite"
        if rule.min is not None:
            assert declared[name], name
        if rule.max is not None:
            assert not declared[name], name


def test_quality_tasks_exist() -> None:
    for task in SUITES["quality"].tasks:  # type: ignore[union-attr]
        assert (TASKS_DIR / f"{task}.yaml").is_file()


def test_unknown_suite_is_one_clear_error() -> None:
    with pytest.raises(
        ConfigError,
        match="no suite 'nope' .*known: benign_risky, harmful, over_refusal, quality, retention",
    ):
        load_suite("nope")


def test_a_policy_typo_is_rejected(tmp_path: Path) -> None:
    bad = tmp_path / "gate.yaml"
    bad.write_text("gate:\n  name: x\n  rules:\n    q/acc: {minimum: 0.5}\n")
    with pytest.raises(ConfigError, match="minimum"):
        load_policy(bad)


def test_the_default_floors_sit_four_standard_errors_inside_every_measurement() -> None:
    """configs/gates/default.yaml records what the default config's champion measured, trained on an AVX2-only
    and on an AVX-512 CPU, evaluated in fp32 and in bf16; every floor must sit at least ``margin_se`` (4)
    standard errors on the passing side of each, so the verdict does not flip with the machine or precision."""
    policy = load_policy(CONFIG_DIR / "gates" / "default.yaml")
    assert policy.margin_se is not None and policy.margin_se >= 4
    assert {m.dtype for m in policy.measured} == {"float32", "bfloat16"}
    assert {"avx2" in m.cpu for m in policy.measured} == {True, False}  # both CPU classes
    margins = floor_margins(policy)
    assert len(margins) == len(policy.measured) * sum(
        1 for r in policy.rules.values() if r.min is not None or r.max is not None
    )
    thin = [f"{m.metric} {m.cpu} {m.dtype}: {m.margin_se:.1f} SE" for m in margins if m.margin_se < policy.margin_se]
    assert not thin, thin


@pytest.mark.parametrize("path", [p for p in POLICIES if load_policy(p).measured], ids=lambda p: p.name)
def test_every_measured_policy_keeps_its_floors_margin_se_inside_its_measurements(path: Path) -> None:
    """A policy that records measurements (configs/gates/smollm2.yaml: the real model, fp32 as it is served) has a
    floor for every ruled metric only where the evidence puts it at least ``margin_se`` standard errors inside."""
    policy = load_policy(path)
    assert policy.margin_se is not None and policy.margin_se >= 4
    thin = [
        f"{m.metric} {m.dtype}: {m.margin_se:.1f} SE" for m in floor_margins(policy) if m.margin_se < policy.margin_se
    ]
    assert not thin, thin
