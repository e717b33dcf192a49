"""Sizes the codebase keeps (docs/architecture.md, "Sizes"): no product module over 500 lines and no function over
120, so each reads in one sitting. Data tables are excepted by name (README, "Development"): their length is data,
not logic.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "flows", "training", "serving", "evals", "registry", "monitoring")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 120
# modules that are data tables (listed in the README's development section)
DATA_TABLES = {
    "training/data/synth_pools.py",
    "training/data/harm_pools_train.py",
    "training/data/harm_pools_twins.py",
}


def modules() -> list[Path]:
    return sorted(p for name in PACKAGES for p in (REPO / name).rglob("*.py") if "__pycache__" not in p.parts)


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def test_no_product_module_is_over_500_lines() -> None:
    over = {rel(p): n for p in modules() if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert set(over) - DATA_TABLES == set(), over


def test_no_product_function_is_over_120_lines() -> None:
    long = []
    for path in modules():
        if rel(path) in DATA_TABLES:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{rel(path)}:{node.lineno} {node.name} ({length} lines)")
    assert long == []


@pytest.mark.parametrize("table", sorted(DATA_TABLES))
def test_each_data_table_is_named_in_the_readme(table: str) -> None:
    assert f"`{table}`" in (REPO / "README.md").read_text(encoding="utf-8")
