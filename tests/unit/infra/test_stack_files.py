"""The production stack's files checked without Docker, a cluster or the network: infra/compose.yaml, the
Dockerfiles, the Kubernetes manifests, the Postgres init script, the DeepSpeed hostfile example and
configs/production.yaml.

No JSON schema for Compose or Kubernetes ships in the environment, so these are structural checks that tie the
files to each other and to the code: build contexts, COPY sources, depends_on targets, named volumes, ``${VAR}``s
listed in .env.example, selectors, ports, probe paths the gateway really serves, console scripts that exist, the
config the containers are started with validating through the project's loader. Where Docker is available,
``docker compose config`` and a Kubernetes schema validator (kubeconform) check the rest (docs/production.md).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from fnmatch import fnmatch
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from support.compose_helpers import (
    COMPOSE,
    INFRA,
    INTERPOLATION,
    REPO,
    command,
    compose,
    env_example,
    environment,
    example_env,
    flag,
    interpolate,
    services,
)

from flows.cli import build_parser
from flows.config import CONFIG_DIR, LifecycleConfig, load_config

K8S = INFRA / "k8s"
DOCKER = INFRA / "docker"
INIT_SCRIPT = INFRA / "postgres" / "init-databases.sh"
HOSTFILE = INFRA / "deepspeed" / "hostfile.example"
PRODUCTION = CONFIG_DIR / "production.yaml"
PROJECT_IMAGES = ("training", "serving", "orchestration")  # built from the project's own environment
# their CUDA variants (the GPU set: pyproject.toml's `gpu` extra + constraints-gpu.txt) -> the CPU image each mirrors
GPU_IMAGES = {"training-gpu": "training", "serving-gpu": "serving"}
IMAGE_ROOT = "/app"  # WORKDIR of the project images: the repository root inside them

# the conditions Compose knows for depends_on
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN", re.IGNORECASE)
URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s\"',]+")


# --- loading -------------------------------------------------------------------------------------------------


@cache
def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


@cache
def production() -> LifecycleConfig:
    return load_config(PRODUCTION)


@cache
def k8s_objects() -> list[dict[str, Any]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        out += [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]
    return out


def k8s(kind: str) -> list[dict[str, Any]]:
    return [o for o in k8s_objects() if o["kind"] == kind]


def strings(node: Any) -> Iterator[str]:
    """Every string value in a parsed YAML tree (keys are not interpolated by Compose, values are)."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from strings(item)


def variables(text: str) -> Iterator[tuple[str, str | None]]:
    """(name, operator) of each interpolation in ``text``; operator is ':?', '?', ':-', '-', ':+', '+' or None."""
    for m in INTERPOLATION.finditer(text):
        if m.group(1):  # $$
            continue
        yield (m.group(2) or m.group(5)), m.group(3)


# --- Dockerfiles: a small parser ----------------------------------------------------------------------------


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, f"{path.name}: the last instruction ends in a line continuation"
    return out


def stages(path: Path) -> list[list[tuple[str, str]]]:
    """Instructions per build stage (each starting with its FROM)."""
    out: list[list[tuple[str, str]]] = []
    for ins in instructions(path):
        if ins[0] == "FROM":
            out.append([])
        if out:
            out[-1].append(ins)
    return out


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), f"not exec form: {args}"
    return value


def copy_sources(args: str) -> list[str]:
    """Sources of a COPY from the build context (none for COPY --from=stage)."""
    words = shlex.split(args)
    if any(w.startswith("--from=") for w in words):
        return []
    words = [w for w in words if not w.startswith("--")]
    if words and words[0].startswith("["):
        words = exec_form(args)
    return words[:-1]


def dockerignore_excludes(rules: list[str], path: str) -> bool:
    """Docker's .dockerignore semantics: the last pattern matching the path or one of its parents wins."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for rule in rules:
        negate = rule.startswith("!")
        pattern = rule[1:] if negate else rule
        pattern = pattern.strip("/")
        if pattern.startswith("**/"):
            hit = any(fnmatch(p.split("/")[-1], pattern[3:]) for p in prefixes)
        else:
            hit = any(fnmatch(p, pattern) and p.count("/") == pattern.count("/") for p in prefixes)
        if hit:
            excluded = not negate
    return excluded


def dockerfiles() -> list[Path]:
    return sorted(DOCKER.glob("*.Dockerfile"))


def final_stage(path: Path) -> list[tuple[str, str]]:
    return stages(path)[-1]


def builder_stage(path: Path) -> list[tuple[str, str]]:
    """The stage named ``builder`` (the first one in the CPU images, after the CUDA base in the GPU images)."""
    (stage,) = [s for s in stages(path) if s[0][1].endswith(" AS builder")]
    return stage


def last(stage: list[tuple[str, str]], word: str) -> str | None:
    found = [args for w, args in stage if w == word]
    return found[-1] if found else None


@cache
def console_scripts() -> dict[str, str]:
    """Console scripts the images can run: the project's own, and those of the installed pinned packages."""
    scripts = dict(pyproject()["project"]["scripts"])
    pinned = {
        line.split("==")[0].lower().replace("_", "-")
        for line in (REPO / "constraints.txt").read_text().splitlines()
        if "==" in line
    }
    for ep in metadata.entry_points(group="console_scripts"):
        dist = ep.dist.name.lower().replace("_", "-") if ep.dist else ""
        if dist in pinned:
            scripts.setdefault(ep.name, ep.value)
    return scripts


def image_argv(path: Path) -> list[str]:
    """ENTRYPOINT + CMD of the final stage, with a tini init in front taken off."""
    stage = final_stage(path)
    entry = last(stage, "ENTRYPOINT")
    cmd = last(stage, "CMD")
    argv = (exec_form(entry) if entry else []) + (exec_form(cmd) if cmd else [])
    if argv and Path(argv[0]).name == "tini":
        argv = argv[2:] if argv[1:2] == ["--"] else argv[1:]
    return argv


def entrypoint_prefix(path: Path) -> list[str]:
    entry = last(final_stage(path), "ENTRYPOINT")
    argv = exec_form(entry) if entry else []
    if argv and Path(argv[0]).name == "tini":
        argv = argv[2:] if argv[1:2] == ["--"] else argv[1:]
    return argv


def built_from(service: dict[str, Any]) -> Path | None:
    build = service.get("build")
    if build is None:
        return None
    context = COMPOSE.parent / (build if isinstance(build, str) else build.get("context", "."))
    return (context / (build.get("dockerfile", "Dockerfile") if isinstance(build, dict) else "Dockerfile")).resolve()


def service_argv(name: str) -> list[str]:
    """What a compose service runs: its image's entrypoint followed by its command (or the image's CMD)."""
    svc = services()[name]
    dockerfile = built_from(svc)
    assert dockerfile is not None, f"{name} is not built from a Dockerfile here"
    cmd = command(svc)
    return entrypoint_prefix(dockerfile) + cmd if cmd else image_argv(dockerfile)


@cache
def gateway_routes() -> set[str]:
    """GET routes of the gateway app (its routers in serving/api/: ``@router.get(...)`` and ``@router.api_route(...)``,
    which they use for GET + HEAD)."""
    text = "".join(p.read_text(encoding="utf-8") for p in sorted((REPO / "serving" / "api").glob("*.py")))
    return set(re.findall(r"@router\.(?:get|api_route)\(\s*\"([^\"]+)\"", text))


def lifecycle_args(argv: list[str]) -> list[str]:
    """The arguments after ``lifecycle``, checked by the real CLI parser (a bad flag exits 2)."""
    assert argv and argv[0] == "lifecycle", f"expected a lifecycle command, got {argv}"
    try:
        build_parser().parse_args(argv[1:])
    except SystemExit as exc:  # argparse's way of saying no
        pytest.fail(f"`{shlex.join(argv)}` does not parse: exit {exc.code}")
    return argv[1:]


# --- every YAML parses ---------------------------------------------------------------------------------------

INFRA_YAML = sorted([*INFRA.rglob("*.yaml"), *INFRA.rglob("*.yml")])


def test_the_stack_files_are_there() -> None:
    names = {p.relative_to(INFRA).as_posix() for p in INFRA.rglob("*") if p.is_file()}
    assert {"compose.yaml", ".env.example", "postgres/init-databases.sh", "deepspeed/hostfile.example"} <= names
    assert {f"docker/{n}.Dockerfile" for n in [*PROJECT_IMAGES, *GPU_IMAGES]} <= names
    assert any(n.startswith("k8s/") for n in names)


@pytest.mark.parametrize("path", INFRA_YAML, ids=lambda p: p.relative_to(INFRA).as_posix())
def test_every_infra_yaml_parses_to_mappings(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
    assert docs, f"{path} is empty"
    assert all(isinstance(d, dict) for d in docs)


# --- configs/production.yaml -----------------------------------------------------------------------------------


def test_production_config_validates_and_points_at_the_stack() -> None:
    cfg = production()
    assert cfg.registry.tracking_uri and urlsplit(cfg.registry.tracking_uri).scheme == "http"
    assert cfg.serving.database_url and cfg.serving.database_url.startswith("postgresql+psycopg://")
    assert cfg.serving.api_keys.storage_uri.startswith("redis://"), "replicas must share their rate limits"
    assert cfg.serving.host == "0.0.0.0", "inside a container the gateway must bind every interface"
    assert (REPO / cfg.evals.gate).is_file()
    assert (REPO / cfg.finetune.deepspeed_config).is_file()


def test_production_config_holds_no_secrets() -> None:
    """The resolved config is saved next to artifacts and hashed onto versions: no URL in it carries a password."""
    for value in strings(production().model_dump(mode="json")):
        for url in URL.findall(value):
            assert urlsplit(url).password is None, f"a password in configs/production.yaml: {url}"


# --- compose: variables and secrets ------------------------------------------------------------------------------


def compose_variables() -> dict[str, set[str | None]]:
    out: dict[str, set[str | None]] = {}
    for value in strings(compose()):
        for name, op in variables(value):
            out.setdefault(name, set()).add(op)
    return out


def test_every_compose_variable_is_in_env_example_and_nothing_else() -> None:
    used = compose_variables()
    listed = env_example()
    assert set(used) - set(listed) == set(), "used in compose.yaml but missing from .env.example"
    assert set(listed) - set(used) == set(), "listed in .env.example but used nowhere in compose.yaml"
    for name, ops in used.items():
        if ops & {":?", "?"}:
            assert not listed[name][1], f"{name} is required (${{{name}:?}}) but commented out in .env.example"


def test_secrets_are_never_written_down() -> None:
    for name, (value, _) in env_example().items():
        if SECRET_NAME.search(name):
            assert value == "", f".env.example must leave {name} empty, got {value!r}"
    for svc_name, svc in services().items():
        for key, value in environment(svc).items():
            if SECRET_NAME.search(key):
                names = [n for n, _ in variables(value)]
                assert names and INTERPOLATION.fullmatch(value), f"{svc_name}.{key} must be a ${{VAR}}, not a value"
        for value in strings(svc):
            for url in URL.findall(value):
                password = urlsplit(url).password
                assert password is None, f"{svc_name}: a password inside a URL: {url}"


def test_env_files_are_git_ignored() -> None:
    ignored = (INFRA / ".gitignore").read_text(encoding="utf-8").split()
    assert ".env" in ignored


# --- compose: structure ----------------------------------------------------------------------------------------


def test_compose_builds_use_dockerfiles_that_exist() -> None:
    built = 0
    for name, svc in services().items():
        dockerfile = built_from(svc)
        if dockerfile is None:
            assert "image" in svc, f"{name} has neither build nor image"
            continue
        built += 1
        assert dockerfile.is_file(), f"{name}: {dockerfile} does not exist"
        assert dockerfile.parent == DOCKER.resolve()
        build = svc["build"]
        assert (COMPOSE.parent / build["context"]).resolve() == REPO, f"{name}: the context must be the repository"
    assert built >= 4


def test_depends_on_targets_exist_with_valid_conditions_and_no_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for name, svc in services().items():
        deps = svc.get("depends_on") or {}
        deps = {d: {"condition": "service_started"} for d in deps} if isinstance(deps, list) else deps
        graph[name] = set(deps)
        for target, spec in deps.items():
            assert target in services(), f"{name} depends on unknown service {target}"
            condition = spec.get("condition", "service_started")
            assert condition in CONDITIONS, f"{name} -> {target}: unknown condition {condition}"
            if condition == "service_healthy":
                assert has_healthcheck(target), f"{name} waits for {target} to be healthy, but it has no healthcheck"
            if condition == "service_completed_successfully":
                assert services()[target].get("restart") == "no", f"{target} is waited on to finish: a one-shot"
    # a cycle would deadlock `up`
    done: set[str] = set()
    while len(done) < len(graph):
        ready = {n for n, deps in graph.items() if n not in done and deps <= done}
        assert ready, f"depends_on cycle among {sorted(set(graph) - done)}"
        done |= ready


def has_healthcheck(name: str) -> bool:
    svc = services()[name]
    check = svc.get("healthcheck")
    if check is not None:
        return not check.get("disable", False) and check.get("test") not in (["NONE"], "NONE")
    dockerfile = built_from(svc)
    return dockerfile is not None and last(final_stage(dockerfile), "HEALTHCHECK") is not None


def test_every_long_running_service_has_a_healthcheck_and_a_restart_policy() -> None:
    for name, svc in services().items():
        if svc.get("restart") == "no" or svc.get("profiles"):  # one-shots and tools run to completion
            continue
        assert has_healthcheck(name), f"{name} has no healthcheck (compose or its image's HEALTHCHECK)"
        test = (svc.get("healthcheck") or {}).get("test", [])
        if test[:3] == ["CMD", "python", "-c"]:
            compile(test[3], f"{name} healthcheck", "exec")
        assert svc.get("restart") in ("always", "unless-stopped", "on-failure"), f"{name} has no restart policy"


def test_named_volumes_are_declared_and_bind_mounts_exist() -> None:
    declared = set(compose().get("volumes") or {})
    used = set()
    for name, svc in services().items():
        for vol in svc.get("volumes") or []:
            source = vol.split(":")[0] if isinstance(vol, str) else vol.get("source", "")
            if source.startswith((".", "/", "~")):
                assert (COMPOSE.parent / source).exists(), f"{name}: bind mount {source} does not exist"
            else:
                assert source in declared, f"{name}: volume {source} is not declared under volumes:"
                used.add(source)
    assert declared == used, f"declared but unused volumes: {declared - used}"


def test_published_ports_are_on_localhost_only() -> None:
    for name, svc in services().items():
        for port in svc.get("ports") or []:
            assert isinstance(port, dict), f"{name}: use the long port syntax (target, published, host_ip)"
            assert port.get("host_ip") == "127.0.0.1", f"{name} publishes port {port['target']} on every interface"


# --- compose: the services agree with each other and with production.yaml ----------------------------------------


def init_script_databases() -> dict[str, str]:
    """Database (and role) name -> the variable holding its password, from init-databases.sh."""
    text = INIT_SCRIPT.read_text(encoding="utf-8")
    return dict(re.findall(r'^create (\w+) "\$\{(\w+):\?', text, flags=re.MULTILINE))


def postgres_url_parts(url: str) -> tuple[str, str, int, str]:
    parts = urlsplit(url)
    assert parts.username and parts.hostname and parts.password is None
    return parts.username, parts.hostname, parts.port or 5432, parts.path.lstrip("/")


def check_postgres_client(name: str, url: str, password_env: str = "PGPASSWORD") -> None:
    """A service connecting to ``url`` reaches the postgres service, its database exists with a role of the same
    name, and the service gets that role's password from the same variable the init script uses."""
    user, host, port, db = postgres_url_parts(url)
    assert host == "postgres" and host in services() and port == 5432
    databases = init_script_databases()
    assert db in databases and user == db, f"{name}: {user}@{db} is not created by {INIT_SCRIPT.name}"
    var = databases[db]
    assert var in environment(services()["postgres"]), f"the postgres service does not pass {var} to the script"
    given = environment(services()[name]).get(password_env, "")
    assert [n for n, _ in variables(given)] == [var], f"{name}: {password_env} must be ${{{var}}}"


def test_init_script_is_valid_bash_and_covers_every_database() -> None:
    subprocess.run(["bash", "-n", str(INIT_SCRIPT)], check=True)
    assert set(init_script_databases()) == {"mlflow", "prefect", "serving"}
    mounts = [v for v in services()["postgres"]["volumes"] if isinstance(v, str) and "initdb.d" in v]
    assert mounts and (COMPOSE.parent / mounts[0].split(":")[0]).resolve() == INIT_SCRIPT


def test_gateway_runs_lifecycle_serve_on_production_yaml() -> None:
    cfg = production()
    gateway = services()["gateway"]
    args = lifecycle_args(service_argv("gateway"))
    assert args[0] == "serve"
    config = flag(args, "--config")
    assert config and (REPO / config).resolve() == PRODUCTION
    assert flag(args, "--port") in (None, str(cfg.serving.port))
    # the replicas publish nothing: clients reach them through gateway-lb, which balances them on that port
    assert "ports" not in gateway and gateway["deploy"]["replicas"] >= 2
    lb = services()["gateway-lb"]
    assert [p["target"] for p in lb["ports"]] == [cfg.serving.port]
    assert environment(lb)["LB_BIND"] == f":{cfg.serving.port}"
    replicas = [environment(lb)[f"GATEWAY_{i + 1}"] for i in range(gateway["deploy"]["replicas"])]
    assert replicas == [f"chat-lifecycle-gateway-{i + 1}:{cfg.serving.port}" for i in range(len(replicas))]
    assert compose()["name"] == "chat-lifecycle"  # the replicas' container names above start with it
    assert lb["depends_on"] == {"gateway": {"condition": "service_started"}}
    # every backend the config names is a service of the stack
    assert cfg.registry.tracking_uri
    mlflow = urlsplit(cfg.registry.tracking_uri)
    assert mlflow.hostname in services() and mlflow.hostname in gateway["depends_on"]
    assert flag(command(services()["mlflow"]), "--port") == str(mlflow.port)
    redis = urlsplit(cfg.serving.api_keys.storage_uri)
    assert redis.hostname in services() and redis.hostname in gateway["depends_on"]
    assert cfg.serving.database_url
    check_postgres_client("gateway", cfg.serving.database_url)


def test_worker_scheduler_and_trainer_reach_the_same_backends_as_the_gateway() -> None:
    cfg = production()
    assert cfg.serving.database_url
    for name in ("prefect-worker", "scheduler", "trainer"):
        check_postgres_client(name, cfg.serving.database_url)  # the rollout controller reads the request log
        api = urlsplit(environment(services()[name])["PREFECT_API_URL"])
        assert api.hostname == "prefect-server" and api.path == "/api"
        assert flag(command(services()["prefect-server"]), "--port") == str(api.port)
        assert environment(services()[name]).get("LIFECYCLE_HOME") is None, "the images set LIFECYCLE_HOME"
    worker = service_argv("prefect-worker")
    assert worker[:3] == ["prefect", "worker", "start"] and flag(worker, "--type") == "process"
    lifecycle_args(["lifecycle", *command(services()["trainer"])])
    # the scheduler serves the loop's deployments on the stack's Prefect server (PREFECT_API_URL set above)
    assert lifecycle_args(service_argv("scheduler"))[:1] == ["schedule"]


def test_mlflow_server_uses_postgres_and_the_object_store() -> None:
    mlflow = services()["mlflow"]
    argv = service_argv("mlflow")
    assert argv[:2] == ["mlflow", "server"]
    backend = flag(argv, "--backend-store-uri")
    assert backend and backend.startswith("postgresql+psycopg://")
    check_postgres_client("mlflow", backend)
    env = environment(mlflow)
    destination = urlsplit(interpolate(flag(argv, "--artifacts-destination") or "", example_env()))
    assert destination.scheme == "s3"
    init_env = environment(services()["minio-init"])
    assert destination.hostname == interpolate(init_env["MLFLOW_BUCKET"], example_env()), (
        "not the bucket minio-init makes"
    )
    endpoint = urlsplit(env["MLFLOW_S3_ENDPOINT_URL"])
    assert endpoint.hostname == "minio" and "minio" in services()
    # MLflow's credentials are the limited key minio-init creates, not the root account
    assert env["AWS_ACCESS_KEY_ID"] == init_env["MLFLOW_S3_ACCESS_KEY"]
    assert env["AWS_SECRET_ACCESS_KEY"] == init_env["MLFLOW_S3_SECRET_KEY"]


def test_mlflow_answers_the_host_the_clients_use() -> None:
    """MLflow 3 rejects Host headers outside --allowed-hosts (403); the clients send the tracking URI's host.
    Matching as mlflow.server.security_utils.is_allowed_host_header does (fnmatch when '*' is in a pattern)."""
    allowed = (flag(command(services()["mlflow"]), "--allowed-hosts") or "").split(",")
    assert production().registry.tracking_uri
    host = urlsplit(production().registry.tracking_uri).netloc
    for header in (host, "localhost:5000", "127.0.0.1:5000"):
        assert any(fnmatch(header, a) if "*" in a else header == a for a in allowed), f"MLflow would refuse {header}"


def test_prefect_server_database_settings_match_the_init_script() -> None:
    env = environment(services()["prefect-server"])
    assert env["PREFECT_SERVER_DATABASE_DRIVER"] == "postgresql+asyncpg"
    assert env["PREFECT_SERVER_DATABASE_HOST"] == "postgres"
    databases = init_script_databases()
    name = env["PREFECT_SERVER_DATABASE_NAME"]
    assert name in databases and env["PREFECT_SERVER_DATABASE_USER"] == name
    assert [n for n, _ in variables(env["PREFECT_SERVER_DATABASE_PASSWORD"])] == [databases[name]]


def test_minio_init_script_makes_a_policy_scoped_to_the_bucket(tmp_path: Path) -> None:
    """Run minio-init's shell script with a stand-in ``mc`` that records its calls: valid sh, and the policy JSON
    it writes parses and grants the bucket only."""
    svc = services()["minio-init"]
    assert svc["entrypoint"][:1] == ["/bin/sh"]
    script = interpolate(command(svc)[0], {})  # compose turns $$ into $; the shell expands the rest
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    stub = bin_dir / "mc"
    stub.write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\ncase "$*" in *"policy create"*) cp "$6" {tmp_path}/p.json;; esac\n'
    )
    stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", **example_env(), "MLFLOW_BUCKET": "art"}
    subprocess.run(["/bin/sh", "-ec", script.replace("/tmp/", f"{tmp_path}/")], env=env, check=True)
    policy = json.loads((tmp_path / "p.json").read_text())
    resources = {r for s in policy["Statement"] for r in s["Resource"]}
    assert resources == {"arn:aws:s3:::art", "arn:aws:s3:::art/*"}
    lines = calls.read_text().splitlines()
    assert "mb --ignore-existing stack/art" in lines
    assert any(line.startswith("admin policy attach stack mlflow-artifacts --user") for line in lines)


# --- Dockerfiles -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", dockerfiles(), ids=lambda p: p.name)
def test_dockerfile_copies_exist_and_are_not_ignored(path: Path) -> None:
    ignore = path.with_name(path.name + ".dockerignore")
    assert ignore.is_file(), f"{ignore.name} keeps .venv, .lifecycle and .git out of the build context"
    rules = [r.strip() for r in ignore.read_text().splitlines() if r.strip() and not r.startswith("#")]
    for heavy in (".venv", ".lifecycle", ".git", "tests"):
        assert dockerignore_excludes(rules, heavy), f"{ignore.name} sends {heavy} to the builder"
    copied = [src for word, args in instructions(path) if word in ("COPY", "ADD") for src in copy_sources(args)]
    assert copied
    for src in copied:
        assert (REPO / src).exists(), f"{path.name}: COPY {src}: not in the repository"
        assert not dockerignore_excludes(rules, src), f"{path.name}: COPY {src}, but {ignore.name} excludes it"


@pytest.mark.parametrize("path", dockerfiles(), ids=lambda p: p.name)
def test_images_run_as_a_non_root_user_and_their_command_exists(path: Path) -> None:
    user = last(final_stage(path), "USER")
    assert user and user.split(":")[0] not in ("root", "0")
    argv = image_argv(path)
    assert argv and argv[0] in console_scripts(), f"{path.name} runs {argv[:1]}, which no installed package provides"
    if argv[0] == "lifecycle":
        lifecycle_args(argv)


def test_project_images_share_one_builder_that_installs_like_setup_env() -> None:
    builders = {name: stages(DOCKER / f"{name}.Dockerfile")[0] for name in PROJECT_IMAGES}
    first = builders[PROJECT_IMAGES[0]]
    assert first[0][1].endswith("AS builder")
    for name, stage in builders.items():
        assert stage == first, f"{name}.Dockerfile's builder stage differs from {PROJECT_IMAGES[0]}.Dockerfile's"
    runs = [args for word, args in first if word == "RUN"]
    script = (REPO / "scripts" / "setup-env.sh").read_text(encoding="utf-8")
    # torch first, at the version pyproject.toml pins, as the CPU build constraints.txt freezes
    torch_pin = next(d for d in pyproject()["project"]["dependencies"] if d.startswith("torch=="))
    frozen = next(line for line in (REPO / "constraints.txt").read_text().splitlines() if line.startswith("torch=="))
    assert frozen.startswith(torch_pin) and frozen.endswith("+cpu")
    torch_runs = [r for r in runs if "torch==" in r]
    assert torch_runs and f'"{frozen}"' in torch_runs[0]
    assert runs.index(torch_runs[0]) < next(i for i, r in enumerate(runs) if "-r /tmp/requirements.txt" in r)
    # every install of project packages is constrained
    for run in runs:
        for part in run.split("&&"):
            if "pip install" in part and "--upgrade" not in part:
                assert "-c constraints.txt" in part, f"unconstrained install: {part.strip()}"
    # the same clean-up and checks as setup-env.sh
    removed = re.search(r"uninstall -q -y ([\w ]+?) 2>", script)
    assert removed and f"uninstall -q -y {removed.group(1)} " in runs[-1]
    expected = re.search(r'grep -v -E \\\n\s+"([^"]+)"', script)
    assert expected and expected.group(1) in runs[-1], "the expected `pip check` lines differ from setup-env.sh's"
    assert "^nvidia-" in runs[-1] and "^nvidia-" in script


@pytest.mark.parametrize("path", dockerfiles(), ids=lambda p: p.name)
def test_dockerfile_shell_and_python_snippets_compile(path: Path) -> None:
    """Every RUN is valid sh (Docker runs it with /bin/sh -c), every `python -c` program compiles."""
    for word, args in instructions(path):
        if word == "RUN":
            subprocess.run(["sh", "-n", "-c", args], check=True)
        if word in ("HEALTHCHECK", "CMD", "ENTRYPOINT") and "[" in args:
            argv = exec_form(args[args.index("[") :])
            for i, arg in enumerate(argv[:-1]):
                if arg == "-c" and Path(argv[0]).name.startswith("python"):
                    compile(argv[i + 1], f"{path.name} {word}", "exec")


@pytest.mark.parametrize(("name", "extra"), [*((n, "cpu") for n in PROJECT_IMAGES), *((n, "gpu") for n in GPU_IMAGES)])
def test_builder_requirements_are_pyproject_dependencies(name: str, extra: str) -> None:
    """Run the builder's own `python -c` that turns pyproject.toml into the requirements of its cached layer: the
    dependencies and the image's engine extra."""
    path = DOCKER / f"{name}.Dockerfile"
    run = next(args for word, args in builder_stage(path) if "/tmp/requirements.txt" in args)
    program = shlex.split(run.split(">")[0])[2]
    out = subprocess.run([sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, check=True).stdout
    project = pyproject()["project"]
    assert out.split("\n")[:-1] == project["dependencies"] + project["optional-dependencies"][extra]


def test_gpu_images_share_one_builder_that_installs_like_setup_env_gpu() -> None:
    """The GPU images' CUDA base and builder stages are identical and install as `GPU=1 scripts/setup-env.sh`
    does: every install constrained by constraints-gpu.txt (nothing of the CPU set), no torch-first step and no
    clean-up, then the same `pip check` filter and the same check against +cpu builds."""
    paths = [DOCKER / f"{name}.Dockerfile" for name in GPU_IMAGES]
    first = stages(paths[0])[:-1]
    assert first[-1] == builder_stage(paths[0])
    for path in paths[1:]:
        assert stages(path)[:-1] == first, f"{path.name}'s build stages differ from {paths[0].name}'s"
    runs = [args for word, args in builder_stage(paths[0]) if word == "RUN"]
    script = (REPO / "scripts" / "setup-env.sh").read_text(encoding="utf-8")
    assert '-c constraints-gpu.txt -e ".[gpu,dev]"' in script
    for run in runs:
        assert "constraints.txt" not in run and "torch==" not in run and "uninstall" not in run, run
        for part in run.split("&&"):
            if "pip install" in part and "--upgrade" not in part:
                assert "-c constraints-gpu.txt" in part, f"unconstrained install: {part.strip()}"
    for check in ('check 2>&1 | grep -v -E "^No broken requirements" || true)', 'grep -E "\\+cpu$"'):
        assert check in script and check in runs[-1], f"setup-env.sh and the GPU builder differ on: {check}"
    # the CUDA base matches the CUDA release torch's wheels are built for (DeepSpeed's JIT ops need nvcc to agree)
    (arg,) = [args for word, args in instructions(paths[0]) if word == "ARG" and args.startswith("CUDA_IMAGE=")]
    cuda = re.search(r":(\d+\.\d+)\.\d+-devel-", arg)
    frozen = (REPO / "constraints-gpu.txt").read_text(encoding="utf-8")
    runtime = re.search(r"^nvidia-cuda-runtime==(\d+\.\d+)\.", frozen, re.MULTILINE)
    assert cuda and runtime and cuda.group(1) == runtime.group(1), f"{arg} vs nvidia-cuda-runtime {runtime}"


@pytest.mark.parametrize(("gpu", "cpu"), GPU_IMAGES.items())
def test_gpu_images_run_like_their_cpu_images(gpu: str, cpu: str) -> None:
    """Same code copied the same way (but the constraints file), and the same runtime contract: user, paths,
    environment, port, healthcheck and command (compose and Kubernetes rely on them)."""

    def copies(name: str) -> list[str]:
        stage = builder_stage(DOCKER / f"{name}.Dockerfile")
        return [args.replace("constraints.txt", "constraints-gpu.txt") for word, args in stage if word == "COPY"]

    assert copies(gpu) == copies(cpu)
    contract = ("COPY", "ENV", "WORKDIR", "USER", "EXPOSE", "HEALTHCHECK", "ENTRYPOINT", "CMD")

    def final(name: str) -> list[tuple[str, str]]:
        return [(word, args) for word, args in final_stage(DOCKER / f"{name}.Dockerfile") if word in contract]

    assert final(gpu) == final(cpu)


def test_project_images_copy_every_package_and_the_files_the_config_names() -> None:
    packages = {p.rstrip("*") for p in pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]}
    cfg = production()
    needed = {f"{p}/" for p in packages} | {"pyproject.toml", "README.md"}
    for name in [*PROJECT_IMAGES, *GPU_IMAGES]:
        copied = {
            src
            for word, args in builder_stage(DOCKER / f"{name}.Dockerfile")
            if word == "COPY"
            for src in copy_sources(args)
        }
        needed_here = needed | {"constraints-gpu.txt" if name in GPU_IMAGES else "constraints.txt"}
        assert needed_here <= copied, f"{name}.Dockerfile does not copy {sorted(needed_here - copied)}"
        for file in (cfg.finetune.deepspeed_config, cfg.evals.gate, PRODUCTION.relative_to(REPO).as_posix()):
            assert any(file.startswith(src) for src in copied if src.endswith("/")), f"{name} image lacks {file}"
        assert last(final_stage(DOCKER / f"{name}.Dockerfile"), "WORKDIR") == IMAGE_ROOT


def test_serving_image_healthcheck_and_port_match_the_gateway() -> None:
    stage = final_stage(DOCKER / "serving.Dockerfile")
    port = production().serving.port
    assert last(stage, "EXPOSE") == str(port)
    check = last(stage, "HEALTHCHECK")
    assert check
    url = urlsplit(URL.findall(check)[0])
    assert url.port == port and url.path in gateway_routes() and url.path == "/readyz"


def test_mlflow_image_matches_the_client_release() -> None:
    pin = next(d for d in pyproject()["project"]["dependencies"] if d.startswith("mlflow=="))
    text = (DOCKER / "mlflow.Dockerfile").read_text(encoding="utf-8")
    assert f'"{pin}"' in text, f"the MLflow server must be the client's release ({pin})"
    assert "-c /tmp/constraints.txt" in text


# --- Kubernetes --------------------------------------------------------------------------------------------------

DNS_1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return list(obj["spec"]["template"]["spec"]["containers"])


def container_ports(obj: dict[str, Any]) -> dict[str, int]:
    ports = {}
    for c in containers(obj):
        for p in c.get("ports") or []:
            ports[p.get("name") or str(p["containerPort"])] = int(p["containerPort"])
    return ports


def resolve_port(obj: dict[str, Any], port: int | str) -> int | None:
    ports = container_ports(obj)
    if isinstance(port, int):
        return port if port in ports.values() else None
    return ports.get(port)


def labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def gateway_deployment() -> dict[str, Any]:
    (deployment,) = [d for d in k8s("Deployment") if d["metadata"]["name"] == "gateway"]
    return deployment


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    resources = set(kustomization["resources"])
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert resources == files
    images = {i["name"] for i in kustomization.get("images", [])}
    for c in containers(gateway_deployment()):
        assert c["image"].split(":")[0] in images, "kustomize cannot swap the gateway's image"


def test_k8s_objects_have_api_version_kind_and_a_valid_unique_name() -> None:
    seen = set()
    assert k8s_objects()
    for obj in k8s_objects():
        assert obj.get("apiVersion") and obj.get("kind"), obj
        name = obj.get("metadata", {}).get("name", "")
        assert DNS_1123.fullmatch(name) and len(name) <= 63, f"bad name {name!r}"
        key = (obj["kind"], name)
        assert key not in seen, f"two {key}"
        seen.add(key)


def test_no_secret_values_in_manifests() -> None:
    assert not k8s("Secret"), "Secrets are created in the cluster (docs/production.md), never committed"
    for deployment in k8s("Deployment"):
        for c in containers(deployment):
            for var in c.get("env") or []:
                if SECRET_NAME.search(var["name"]):
                    assert "value" not in var and var["valueFrom"]["secretKeyRef"]["name"], var["name"]


def test_deployments_select_their_own_pods() -> None:
    for d in k8s("Deployment"):
        assert labels_match(d["spec"]["selector"]["matchLabels"], d["spec"]["template"]["metadata"]["labels"])


def test_services_select_a_deployment_and_target_its_ports() -> None:
    selecting = [s for s in k8s("Service") if s["spec"].get("type") != "ExternalName"]
    assert selecting
    for svc in selecting:
        targets = [
            d
            for d in k8s("Deployment")
            if labels_match(svc["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])
        ]
        assert targets, f"Service {svc['metadata']['name']} selects no Deployment's pods"
        for port in svc["spec"]["ports"]:
            for d in targets:
                assert resolve_port(d, port.get("targetPort", port["port"])), f"{port} is no container port"


def test_probes_hit_routes_the_gateway_serves() -> None:
    deployment = gateway_deployment()
    (gateway,) = containers(deployment)
    probes = {kind: gateway[kind]["httpGet"] for kind in ("startupProbe", "livenessProbe", "readinessProbe")}
    for kind, probe in probes.items():
        assert probe["path"] in gateway_routes(), (
            f"{kind}: {probe['path']} is not a route of the gateway (serving/api/)"
        )
        assert resolve_port(deployment, probe["port"]) == production().serving.port
    assert probes["readinessProbe"]["path"] == "/readyz" and probes["livenessProbe"]["path"] == "/healthz"


def test_gateway_pod_holds_a_gpu_for_its_vllm_engines() -> None:
    (gateway,) = containers(gateway_deployment())
    resources = gateway["resources"]
    assert int(resources["limits"]["nvidia.com/gpu"]) >= 1
    # extended resources cannot be overcommitted: a request, when given, equals the limit
    assert (
        resources["requests"].get("nvidia.com/gpu", resources["limits"]["nvidia.com/gpu"])
        == resources["limits"]["nvidia.com/gpu"]
    )
    assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"]
    assert gateway_deployment()["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def gateway_config_path() -> tuple[dict[str, Any], str]:
    """The ConfigMap and key the gateway's --config names, through its volume mounts."""
    deployment = gateway_deployment()
    (gateway,) = containers(deployment)
    config = flag(gateway["args"], "--config")
    assert config
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    for mount in gateway["volumeMounts"]:
        prefix = mount["mountPath"].rstrip("/") + "/"
        if config.startswith(prefix) and "configMap" in volumes[mount["name"]]:
            (cm,) = [
                c for c in k8s("ConfigMap") if c["metadata"]["name"] == volumes[mount["name"]]["configMap"]["name"]
            ]
            return cm, config.removeprefix(prefix)
    raise AssertionError(f"--config {config} is not on a ConfigMap volume")


def cluster_config(tmp_path: Path) -> LifecycleConfig:
    """The ConfigMap's config loaded through the project's loader, its image path mapped onto the repository."""
    cm, key = gateway_config_path()
    data = yaml.safe_load(cm["data"][key])
    parent = str(data["extends"])
    assert parent.startswith(IMAGE_ROOT + "/"), f"extends {parent}: not a file of the image ({IMAGE_ROOT})"
    data["extends"] = str(REPO / parent.removeprefix(IMAGE_ROOT + "/"))
    path = tmp_path / key
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return load_config(path)


def test_gateway_config_map_validates_and_matches_the_container(tmp_path: Path) -> None:
    cfg = cluster_config(tmp_path)
    (gateway,) = containers(gateway_deployment())
    args = lifecycle_args(["lifecycle", *gateway["args"]])
    assert args[0] == "serve"
    assert list(container_ports(gateway_deployment()).values()) == [cfg.serving.port]
    assert cfg.serving.host == "0.0.0.0"
    assert cfg.serving.database_url and urlsplit(cfg.serving.database_url).password is None
    assert "PGPASSWORD" in {v["name"] for v in gateway["env"]}, "the database URL has no password: libpq needs it"
    # the stack's backends by the same short names as in compose: Services of the namespace
    names = {s["metadata"]["name"]: s for s in k8s("Service")}
    assert cfg.registry.tracking_uri
    for url in (cfg.registry.tracking_uri, cfg.serving.database_url, cfg.serving.api_keys.storage_uri):
        parts = urlsplit(url)
        default = {"postgresql+psycopg": 5432, "redis": 6379}.get(parts.scheme)
        assert parts.hostname in names, f"{url}: no Service named {parts.hostname}"
        assert parts.port or default in [p["port"] for p in names[parts.hostname]["spec"]["ports"]]


def test_autoscaling_and_disruption_budget_target_the_gateway(tmp_path: Path) -> None:
    from serving.pipeline.metrics import ServingMetrics

    deployment = gateway_deployment()
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    (hpa,) = k8s("HorizontalPodAutoscaler")
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["kind"], ref["name"]) == ("Deployment", "gateway")
    exposed = ServingMetrics().render().decode()
    cfg = cluster_config(tmp_path)
    for metric in hpa["spec"]["metrics"]:
        name = metric["pods"]["metric"]["name"]
        assert re.search(rf"^# TYPE {name} gauge$", exposed, re.MULTILINE), f"the gateway exports no gauge {name}"
        # scale out before the gateway starts shedding load
        assert float(metric["pods"]["target"]["averageValue"]) < cfg.serving.brownout.queue_depth
    (pdb,) = k8s("PodDisruptionBudget")
    assert labels_match(pdb["spec"]["selector"]["matchLabels"], labels)
    assert hpa["spec"]["minReplicas"] > pdb["spec"]["minAvailable"], "a drain could never evict a replica"


# --- DeepSpeed hostfile ------------------------------------------------------------------------------------------


def test_hostfile_example_is_what_the_deepspeed_launcher_parses() -> None:
    """The format of deepspeed.launcher.runner._parse_hostfile (not imported: importing DeepSpeed takes ~10 s):
    '<host> slots=<n>' per line, '#' comments, each host once."""
    hosts: dict[str, int] = {}
    for line in HOSTFILE.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.search(r"^(\S+)\s+slots=(\d+)", line)
        assert m, f"DeepSpeed rejects the hostfile line {line!r}"
        assert m.group(1) not in hosts, f"{m.group(1)} twice"
        hosts[m.group(1)] = int(m.group(2))
    assert len(hosts) >= 2 and all(n > 0 for n in hosts.values())


def test_hostfile_example_command_is_a_valid_multi_node_config() -> None:
    text = HOSTFILE.read_text(encoding="utf-8")
    overrides = re.findall(r"--set (\S+)", text)
    assert overrides
    cfg = load_config(PRODUCTION, overrides)
    assert cfg.finetune.distributed.launcher == "deepspeed" and cfg.finetune.distributed.hostfile
    assert (REPO / cfg.finetune.deepspeed_config).is_file()
    command = re.search(r"lifecycle (train --config \S+)", text)
    assert command
    lifecycle_args(["lifecycle", *command.group(1).split(), *[a for o in overrides for a in ("--set", o)]])
