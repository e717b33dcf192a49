"""The architecture is a checked contract: import-linter (``[tool.importlinter]`` in pyproject.toml, run by
``make lint``) keeps the real tree, and breaks, naming the right contract, on each kind of planted import.

Each case copies the packages to a temporary folder, adds one import line, and runs ``lint-imports`` there.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "flows", "training", "serving", "evals", "registry", "monitoring")
LINT = Path(sys.executable).with_name("lint-imports")


def lint(root: Path) -> tuple[int, dict[str, str]]:
    """Run every contract on the packages under ``root``; the exit code and each contract's verdict by name."""
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "400", "NO_COLOR": "1"}
    out = subprocess.run(
        [str(LINT), "--no-cache", "--config", str(root / "pyproject.toml")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    verdicts = dict(re.findall(r"^(.+?) (KEPT|BROKEN)\b", out.stdout, flags=re.MULTILINE))
    return out.returncode, verdicts


def copy_tree(dest: Path) -> Path:
    for name in PACKAGES:
        shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(REPO / "pyproject.toml", dest / "pyproject.toml")
    return dest


def contract_names() -> dict[str, str]:
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    return {c["id"]: c["name"] for c in config["contracts"]}


def test_the_tree_keeps_every_contract() -> None:
    code, verdicts = lint(REPO)
    assert verdicts == {name: "KEPT" for name in contract_names().values()}
    assert code == 0


PLANTED = [
    # (module, the line added to it, the contracts that must break: exactly these)
    # nothing imports flows (and the flows modules low in their layers reach core.errors, so theirs break too)
    (
        "core/errors.py",
        "import flows.cli",
        {"stages", "flows-layers", "commands-layers", "training-layers", "finetune-layers", "serving-layers"},
    ),
    ("training/data/snapshot.py", "import evals.gate", {"stages"}),  # training must not reach into evals
    # the data side knows nothing of the model (the model side reads data: a cycle too); the worker's pieces
    # nothing of what uses them
    ("training/data/records.py", "import training.model.modelio", {"training-layers", "acyclic"}),
    ("training/finetune/collectives.py", "import training.finetune.objectives", {"finetune-layers", "acyclic"}),
    # inside serving: the database knows nothing of the pipeline that writes it (which imports it: a cycle too), the
    # wire format nothing of the engines
    ("serving/state/store.py", "import serving.pipeline.gateway", {"serving-layers", "acyclic"}),
    # (and a cycle: the engines read the wire's errors)
    ("serving/wire/protocol.py", "import serving.engines.engine", {"serving-layers", "acyclic"}),
    ("serving/pipeline/gateway.py", "import mlflow", {"mlflow"}),  # only registry talks to MLflow
    ("monitoring/window.py", "import prefect", {"prefect"}),  # only flows talks to Prefect
    ("flows/stages.py", "import prefect", {"prefect-in-flows"}),  # the adapters stay plain Python
    ("flows/stages.py", "import flows.train", {"flows-layers", "acyclic"}),  # an adapter reaching up into a flow
    ("flows/commands/base.py", "import flows.commands.render", {"commands-layers"}),
    ("monitoring/drift.py", "import monitoring.drift_html", {"acyclic"}),  # the cycle drift <-> drift_html
    ("evals/gate.py", "import deepspeed", {"deepspeed"}),
    ("registry/store.py", "import evidently", {"evidently"}),
    ("flows/stages.py", "import bentoml", {"bentoml"}),
]


@pytest.mark.parametrize(
    ("module", "line", "contracts"), PLANTED, ids=[f"{'+'.join(sorted(c))}:{m}" for m, _, c in PLANTED]
)
def test_a_planted_import_breaks_its_contract(tmp_path: Path, module: str, line: str, contracts: set[str]) -> None:
    root = copy_tree(tmp_path)
    path = root / module
    path.write_text(path.read_text(encoding="utf-8") + f"\n{line}  # planted\n", encoding="utf-8")
    code, verdicts = lint(root)
    names = contract_names()
    assert code == 1
    assert verdicts == {name: "BROKEN" if id_ in contracts else "KEPT" for id_, name in names.items()}
