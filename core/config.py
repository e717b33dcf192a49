"""Config machinery shared by every stage: a strict pydantic base, YAML loading with ``extends``, ``--set a.b=c``
overrides, and validation errors turned into one readable line.

Stage configs (``training/config.py`` ...) subclass :class:`StrictModel`; ``flows/config.py`` composes them into
the root config. A config file may start with ``extends: other.yaml`` (relative to itself) to inherit and
override another file key by key.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from core.errors import ConfigError
from core.hashing import sha256_json

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """Base of every config model: unknown keys are errors and values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=True)

    def config_hash(self) -> str:
        return sha256_json(self.model_dump(mode="json"))


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def load_yaml(path: Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a config file, following ``extends`` chains."""
    path = path.resolve()
    if path in _seen:
        raise ConfigError(f"config: 'extends' loops back to {path}")
    if not path.is_file():
        raise ConfigError(f"config: file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"config: {path}{where} is not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path} must be a mapping of keys, got {type(data).__name__}")
    parent = data.pop("extends", None)
    if parent is None:
        return data
    return deep_merge(load_yaml(path.parent / str(parent), (*_seen, path)), data)


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b=c`` -> (["a", "b"], c) with ``c`` read as a YAML scalar/list (``3`` is an int, ``[x, y]`` a list)."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"config: --set expects KEY=VALUE with a dotted key (like snapshot.seed=3), got {item!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    out = copy.deepcopy(data)
    for item in overrides:
        path, value = parse_override(item)
        node = out
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[path[-1]] = value
    return out


def _model_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model class that owns the last element of ``loc`` (for listing allowed keys)."""
    current: type[BaseModel] = model
    for part in loc[:-1]:
        field = current.model_fields.get(str(part))
        annotation = field.annotation if field else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        current = annotation
    return current


def describe_validation_error(exc: ValidationError, model: type[BaseModel]) -> str:
    """One line naming each dotted key and what is allowed there."""
    parts = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in loc) or "<root>"
        if err["type"] == "extra_forbidden":
            owner = _model_at(model, loc)
            allowed = ", ".join(sorted(owner.model_fields)) if owner else "?"
            parts.append(f"unknown key '{key}' (allowed here: {allowed})")
        else:
            value = err.get("input")
            shown = "" if isinstance(value, dict | list) else f" = {value!r}"
            parts.append(f"{key}{shown}: {err['msg'].removeprefix('Value error, ')}")
    return "config: " + "; ".join(parts)


def validate(model: type[M], data: Mapping[str, Any]) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, model)) from None


def load(model: type[M], path: Path | None, overrides: Iterable[str] = ()) -> M:
    """Load ``model`` from ``path`` (or from its defaults when None) with ``--set`` overrides applied."""
    data = load_yaml(path) if path is not None else {}
    return validate(model, apply_overrides(data, overrides))


def dump_yaml(model: BaseModel) -> str:
    return yaml.safe_dump(model.model_dump(mode="json"), sort_keys=False, allow_unicode=True)
