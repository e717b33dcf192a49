from __future__ import annotations

from pathlib import Path

import pytest

from core.config import apply_overrides, load_yaml, parse_override
from core.errors import ConfigError
from flows.config import CONFIG_DIR, LifecycleConfig, load_config

SHIPPED = sorted(CONFIG_DIR.glob("*.yaml")) + sorted((CONFIG_DIR / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_loads(path: Path) -> None:
    cfg = load_config(path)
    assert isinstance(cfg, LifecycleConfig)


def test_shipped_configs_exist() -> None:
    assert {p.name for p in SHIPPED} >= {"default.yaml", "tiny.yaml"}


def test_default_yaml_spells_out_the_code_defaults() -> None:
    """default.yaml documents the defaults: it must not drift from the models' own defaults."""
    assert load_config(CONFIG_DIR / "default.yaml") == LifecycleConfig()


def test_tiny_extends_default_and_overrides_sizes() -> None:
    tiny, default = load_config(CONFIG_DIR / "tiny.yaml"), load_config(CONFIG_DIR / "default.yaml")
    assert tiny.bootstrap.model.hidden_size < default.bootstrap.model.hidden_size
    assert tiny.snapshot == default.snapshot  # inherited untouched


@pytest.mark.parametrize(
    ("item", "path", "value"),
    [
        ("a.b=3", ["a", "b"], 3),
        ("a=0.5", ["a"], 0.5),
        ("a.b=true", ["a", "b"], True),
        ("a=[x, y]", ["a"], ["x", "y"]),
        ("a=null", ["a"], None),
        ("a=some text", ["a"], "some text"),
        ("a=", ["a"], ""),
    ],
)
def test_parse_override_reads_yaml_scalars(item: str, path: list[str], value: object) -> None:
    assert parse_override(item) == (path, value)


@pytest.mark.parametrize("item", ["novalue", "=3", "a..b=1", ".a=1"])
def test_parse_override_rejects_malformed(item: str) -> None:
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_override(item)


def test_apply_overrides_creates_nested_keys_without_mutating() -> None:
    data = {"a": {"b": 1}}
    out = apply_overrides(data, ["a.c=2", "d.e=3"])
    assert out == {"a": {"b": 1, "c": 2}, "d": {"e": 3}}
    assert data == {"a": {"b": 1}}


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("snapshot.tst_fraction=0.1", "unknown key 'snapshot.tst_fraction' (allowed here: "),
        ("snapshot.on_invalid=ignore", "snapshot.on_invalid = 'ignore': Input should be 'fail' or 'drop'"),
        ("snapshot.test_fraction=2", "snapshot.test_fraction = 2: Input should be less than 1"),
        ("bootstrap.model.hidden_size=250", "bootstrap.model: hidden_size must be divisible by num_heads"),
        (
            "bootstrap.model.hidden_size=100",
            "bootstrap.model: hidden_size / num_heads must be a head size vLLM",
        ),
        ("data.generator.counts.poetry=5", "data.generator.counts.poetry"),
        (
            "data.generator.counts.everyday_varied=5",
            "data.generator.counts.everyday_varied needs finetune.self_replies.enabled: its prompts have no generated "
            "answer",
        ),
        (
            "bootstrap.pretrain.steps=many",
            "bootstrap.pretrain.steps = 'many': Input should be a valid integer",
        ),
        (
            "nonsense=1",
            "unknown key 'nonsense' (allowed here: base_model, bootstrap, data, evals, finetune, home, monitoring, "
            "preference, quantize, registry, rollout, run, safety_classifier, schedule, serving, snapshot)",
        ),
    ],
)
def test_bad_values_name_the_dotted_key_in_one_line(override: str, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    message = str(err.value)
    assert expected in message
    assert "\n" not in message
    assert err.value.exit_code == 2


def test_extends_chain_and_loop(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("extends: b.yaml\nx: 1\n")
    (tmp_path / "b.yaml").write_text("x: 0\ny: 2\n")
    assert load_yaml(tmp_path / "a.yaml") == {"x": 1, "y": 2}
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(ConfigError, match="loops back"):
        load_yaml(tmp_path / "a.yaml")


def test_invalid_yaml_is_one_line_with_the_line_number(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("snapshot:\n  test_fraction: [0.1\n")
    with pytest.raises(ConfigError, match=r"bad.yaml line \d+ is not valid YAML"):
        load_config(bad)


def test_config_hash_is_stable_and_sensitive() -> None:
    a, b = load_config(None), load_config(None)
    assert a.config_hash() == b.config_hash()
    assert a.config_hash() != load_config(None, ["bootstrap.seed=7"]).config_hash()
