"""Orchestration: the root config, the ``lifecycle`` CLI and the Prefect flows (the only package importing
Prefect). Nothing imports ``flows``."""
