# chat-lifecycle developer entry points. Every target sets up ./.venv first if it is missing or stale.
#   make run        the main job: `lifecycle run` on configs/default.yaml
#   make test       the default test suite (unit + integration + e2e, without the `slow` marker)
#   make test-all   everything, slow tests included
#   make lint       ruff, ruff format --check, mypy, import-linter (the architecture's contracts: pyproject.toml)

VENV := .venv
BIN := $(VENV)/bin
ARGS ?=

.PHONY: setup run test test-all lint
setup:
	@scripts/setup-env.sh

run: setup
	$(BIN)/lifecycle run $(ARGS)

test: setup
	$(BIN)/python -m pytest $(ARGS)

test-all: setup
	$(BIN)/python -m pytest -m "not gpu" $(ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
