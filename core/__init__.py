"""Shared foundations every stage uses: the exception tree, the home-folder layout, content hashing,
the strict config base class and the runtime environment switches applied at entry points.

Nothing here imports a framework (torch, MLflow, Prefect, BentoML); importing it has no side effects.
"""
