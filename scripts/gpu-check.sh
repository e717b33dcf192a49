#!/usr/bin/env bash
# The training path's GPU checks in one go: the GPU tests (3.7 min on one H100, 3 at a time), then the throughput
# benchmark (about 8 min for every trainer; BENCH_ARGS="--only ..." for a subset).
#
#   scripts/gpu-check.sh [OUT_DIR]          # default OUT_DIR: ./gpu-check
#   PYTHON=python3 BENCH_ARGS="--only zero2-sft+compile" scripts/gpu-check.sh /tmp/out
#
# PYTHON runs both (default: .venv/bin/python, else python3): an interpreter with torch (CUDA), DeepSpeed,
# transformers, peft, pydantic and pytest; pytest-xdist, where installed, runs the tests 3 at a time. Each part has
# its own time limit (TESTS_TIMEOUT, BENCH_TIMEOUT, seconds); TESTS_ARGS adds pytest arguments (e.g. "-k lora").
# OUT_DIR gets gpu.txt (card, driver, versions),
# tests.log, bench.log and train_gpu.json. The exit code is non-zero if either part failed.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-check}
mkdir -p "$out"
py=${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}
export PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
  "$py" -c 'import torch, deepspeed, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda,
"deepspeed", deepspeed.__version__, "transformers", transformers.__version__)'
  lscpu | grep -E "^Model name" || true
} 2>&1 | tee "$out/gpu.txt"
workers=()
"$py" -c "import xdist" 2>/dev/null && workers=(-n 3)
# 4 threads each: 3 test processes with a thread per core each (the bootstrap's CPU pretraining) stalled the first
# H100 run for minutes; the ranks set their own threads
# shellcheck disable=SC2086  # TESTS_ARGS and BENCH_ARGS are lists of arguments
OMP_NUM_THREADS=4 timeout "${TESTS_TIMEOUT:-300}" "$py" -m pytest -m gpu tests/gpu "${workers[@]}" -p no:cacheprovider -q -rA \
  ${TESTS_ARGS:-} 2>&1 | tee "$out/tests.log"
tests=${PIPESTATUS[0]}
# shellcheck disable=SC2086
timeout "${BENCH_TIMEOUT:-600}" "$py" benchmarks/train_gpu.py --json "$out/train_gpu.json" ${BENCH_ARGS:-} \
  2>&1 | tr '\r' '\n' | grep --line-buffered -v -E "it/s\]|s/it\]|step/s|s/step|^Loading weights|^Writing model" \
  | tee "$out/bench.log"
bench=${PIPESTATUS[0]}
echo "gpu-check: tests exit $tests, benchmark exit $bench"
(( tests == 0 && bench == 0 ))
