"""Helpers shared by the tests: importable as ``support.<module>`` because pyproject puts tests/ on the path."""
