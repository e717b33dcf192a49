"""infra/compose.yaml read as Compose reads it, for the tests that check it against the code and against
``scripts/stack.sh`` (tests/unit/infra): its services, their commands, environments and flags, and Compose's
``${VAR}`` interpolation with the values of infra/.env.example."""

from __future__ import annotations

import re
import shlex
from functools import cache
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
COMPOSE = INFRA / "compose.yaml"
ENV_EXAMPLE = INFRA / ".env.example"
# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error}, ${VAR?error}, ${VAR:+alt}, $VAR; $$ is a literal $
INTERPOLATION = re.compile(r"\$(?:(\$)|\{([A-Za-z_]\w*)(?:(:?[-?+])([^}]*))?\}|([A-Za-z_]\w*))")


@cache
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def services() -> dict[str, dict[str, Any]]:
    return dict(compose()["services"])


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's interpolation, as far as these files use it: values from ``env``, else the default."""

    def one(m: re.Match[str]) -> str:
        if m.group(1):
            return "$"
        name, op, arg = (m.group(2) or m.group(5)), m.group(3) or "", m.group(4) or ""
        value = env.get(name)
        if op.startswith(":") and not value or value is None:
            return arg if op.endswith("-") else ""
        return value

    return INTERPOLATION.sub(one, text)


@cache
def env_example() -> dict[str, tuple[str, bool]]:
    """.env.example's variables: name -> (value, commented out)."""
    out = {}
    for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines():
        m = re.fullmatch(r"(#\s*)?([A-Z_][A-Z0-9_]*)=(.*)", line.strip())
        if m:
            out[m.group(2)] = (m.group(3).strip(), bool(m.group(1)))
    return out


def example_env() -> dict[str, str]:
    """The values compose would see with .env.example copied and every secret filled in."""
    return {name: value or f"example-{name.lower()}" for name, (value, _) in env_example().items()}


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def command(service: dict[str, Any]) -> list[str]:
    cmd = service.get("command") or []
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


def flag(argv: list[str], name: str) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE`` in an argument list."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None
