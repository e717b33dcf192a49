# syntax=docker/dockerfile:1
# The MLflow tracking + registry server of the stack: metadata in PostgreSQL, artifacts in the object store,
# proxied (clients download versions through the server, so only this container holds object-store credentials).
#
#   docker build -f infra/docker/mlflow.Dockerfile -t chat-lifecycle-mlflow .      # from the repository root
#
# The same mlflow release as the project's client (pyproject.toml pins mlflow==3.17.2; a client and server of
# different releases are not supported), with the shared pins of constraints.txt; boto3 (not a project
# dependency) is the S3 client behind --artifacts-destination s3://..., psycopg the PostgreSQL driver.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PYTHONUNBUFFERED=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/*
COPY constraints.txt /tmp/constraints.txt
RUN pip install -c /tmp/constraints.txt "mlflow==3.17.2" "psycopg[binary]" "boto3==1.44.5" \
 && rm /tmp/constraints.txt
RUN useradd --create-home --uid 10001 --user-group --shell /usr/sbin/nologin mlflow
WORKDIR /home/mlflow
USER mlflow
EXPOSE 5000
# /health is exempt from MLflow's Host-header check (--allowed-hosts), so it answers on 127.0.0.1 too
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=5 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:5000/health', timeout=4)"]
ENTRYPOINT ["tini", "--", "mlflow"]
CMD ["server", "--host", "0.0.0.0", "--port", "5000"]
