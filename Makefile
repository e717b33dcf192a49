# chat-lifecycle developer entry points. Every target sets up ./.venv first if it is missing or stale.
#   make setup GPU=1   ./.venv with the GPU set (CUDA torch and vLLM: constraints-gpu.txt) instead of the CPU set;
#                      later targets keep it, GPU=0 goes back (scripts/setup-env.sh)
#   make run        the main job: `lifecycle run` on configs/default.yaml
#   make test       the default test suite (unit + integration + e2e, without the `slow` marker)
#   make test-all   everything, slow tests included
#   make test-gpu   the DeepSpeed path on CUDA (tests/gpu; needs a GPU, torch, DeepSpeed, transformers only);
#                   PY=python3 runs it with another interpreter (a bare GPU machine without .venv)
#   make lint       ruff, ruff format --check, mypy, import-linter (the architecture's contracts: pyproject.toml)

VENV := .venv
BIN := $(VENV)/bin
ARGS ?=

.PHONY: setup run test test-all test-gpu lint
setup:
	@scripts/setup-env.sh

run: setup
	$(BIN)/lifecycle run $(ARGS)

test: setup
	$(BIN)/python -m pytest $(ARGS)

test-all: setup
	$(BIN)/python -m pytest -m "not gpu" $(ARGS)

test-gpu:
	@[ -n "$(PY)" ] || $(MAKE) --no-print-directory setup
	$(or $(PY),$(BIN)/python) -m pytest -m gpu tests/gpu $(ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
