from __future__ import annotations

import dataclasses

import pytest

from registry.lineage import LINEAGE_TAGS, PREFERENCE_TAGS, Lineage
from registry.store import flatten, parse_ref


def test_flatten_nested_config_for_params() -> None:
    assert flatten({"a": {"b": 1, "c": [1, 2], "d": None}, "e": True}) == {
        "a.b": "1",
        "a.c": "[1, 2]",
        "a.d": "null",
        "e": "true",
    }


def test_lineage_tags_cover_every_field() -> None:
    values = {f.name: f"v-{f.name}" for f in dataclasses.fields(Lineage)}
    values["seed"] = 3  # type: ignore[assignment]
    tags = Lineage(**values).tags()  # type: ignore[arg-type]
    assert set(tags) == set(LINEAGE_TAGS + PREFERENCE_TAGS)
    sft = Lineage(**{k: v for k, v in values.items() if f"lineage.{k}" not in PREFERENCE_TAGS} | {"objective": "sft"})  # type: ignore[arg-type]
    assert set(sft.tags()) == set(LINEAGE_TAGS) and sft.tags()["lineage.objective"] == "sft"
    assert tags["lineage.seed"] == "3" and tags["lineage.snapshot"] == "v-snapshot"
    for required in (
        "snapshot",
        "base_model",
        "config_hash",
        "git_sha",
        "seed",
        "tokenizer_hash",
        "chat_template_hash",
        "weights_hash",
        "flow_run_id",
        "method",
    ):
        assert f"lineage.{required}" in tags


@pytest.mark.parametrize(
    ("ref", "parsed"),
    [
        ("chat@champion", ("chat", "champion", None)),
        ("chat/3", ("chat", None, "3")),
        ("models:/chat-base/12", ("chat-base", None, "12")),
        ("models:/chat@previous-champion", ("chat", "previous-champion", None)),
    ],
)
def test_model_references(ref: str, parsed: tuple[str, str | None, str | None]) -> None:
    assert parse_ref(ref) == parsed


@pytest.mark.parametrize("ref", ["chat", "chat@", "chat/x", "@champion", "chat@champ ion"])
def test_bad_model_references_are_config_errors(ref: str) -> None:
    from core.errors import ConfigError

    with pytest.raises(ConfigError, match="NAME@ALIAS or NAME/VERSION"):
        parse_ref(ref)
