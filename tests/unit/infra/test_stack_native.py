"""``scripts/stack.sh`` against infra/compose.yaml: the native stack runs each compose service with the same command,
settings and ports, so the two cannot drift apart unnoticed.

Reads what the script would run (``stack.sh plan``: per compose service its native process, port, environment and
command) and the config it gives the lifecycle's processes (``stack.sh config``); starts nothing. The differences
allowed are the ones a native stack must have, each listed here: services bind 127.0.0.1 instead of 0.0.0.0,
compose's service names (postgres, mlflow, redis, prefect-server) become 127.0.0.1, the object store becomes a
folder the MLflow server proxies the same way, a second worker needs a name and a health port of its own, and so
does each gateway replica (compose gives each container port 3000 and a name HAProxy finds it by); Prometheus and
Alertmanager are Debian's binaries (prometheus-alertmanager is Debian's name for alertmanager) on copies of
infra/'s files with the native addresses.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from support.compose_helpers import INFRA, REPO, command, environment, example_env, flag, interpolate, services

from flows.config import CONFIG_DIR, load_config

STACK = REPO / "scripts" / "stack.sh"
NATIVE_HOST = "127.0.0.1"
# compose's names, unresolvable natively
SERVICE_HOSTS = {"postgres", "mlflow", "redis", "prefect-server", "minio", "alertmanager"}
OBJECT_STORE_ENV = {"MLFLOW_S3_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"}
# what a native process needs that a container gets from its image or its own network namespace
NATIVE_ONLY_ENV = {"LIFECYCLE_HOME", "PREFECT_HOME", "PREFECT_WORKER_WEBSERVER_HOST", "PREFECT_WORKER_WEBSERVER_PORT"}


@dataclass(frozen=True)
class Native:
    service: str  # the compose service it stands for
    process: str  # '-' when there is no process (the object store, the tools profile)
    port: int | None
    env: dict[str, str]
    argv: list[str]


@cache
def plan() -> tuple[Native, ...]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STACK_") and k != "GATEWAY_PORT"}
    env["STACK_HOME"] = str(stack_home())
    out = subprocess.run(["bash", str(STACK), "plan"], capture_output=True, text=True, env=env, check=True).stdout
    rows = []
    for line in out.splitlines():
        service, process, port, pairs, cmd = line.split("\t")
        variables = dict(p.split("=", 1) for p in pairs.split(",")) if pairs != "-" else {}
        rows.append(Native(service, process, None if port == "-" else int(port), variables, shlex.split(cmd)))
    return tuple(rows)


def stack_home() -> Path:
    """Where the plan says the stack lives; ``plan`` and ``config`` create nothing there."""
    return Path("/nonexistent/stack-plan")


def native(service: str) -> list[Native]:
    return [n for n in plan() if n.service == service]


def one(service: str) -> Native:
    (n,) = native(service)
    return n


def compose_argv(service: str) -> list[str]:
    """The service's command; for an image whose ENTRYPOINT is a program (``tini -- mlflow``), that program first."""
    argv = [interpolate(a, example_env()) for a in command(services()[service])]
    dockerfile = (services()[service].get("build") or {}).get("dockerfile")
    if dockerfile:  # relative to the build context, the repository
        lines = [ln for ln in (REPO / dockerfile).read_text().splitlines() if ln.startswith("ENTRYPOINT")]
        entry = json.loads(lines[-1].removeprefix("ENTRYPOINT")) if lines else []
        if entry and entry[-1] != "--" and argv[0] != entry[-1]:
            argv = [entry[-1], *argv]
    return argv


def published(service: str) -> list[int]:
    return [int(p["target"]) for p in services()[service].get("ports") or []]


def localized(value: str) -> str:
    """A compose value as the native stack writes it: service host names -> 127.0.0.1."""
    for name in SERVICE_HOSTS:
        value = value.replace(f"@{name}:", f"@{NATIVE_HOST}:").replace(f"//{name}:", f"//{NATIVE_HOST}:")
    return value


def test_every_compose_service_has_a_native_equivalent_and_no_other() -> None:
    assert {n.service for n in plan()} == set(services())
    # the object store has no process: MLflow's artifacts destination is a folder, proxied to clients the same way
    for service in ("minio", "minio-init"):
        assert one(service).process == "-" and one(service).argv[0] == "-"
    assert one("mlflow").argv[0].endswith("/mlflow")
    destination = flag(one("mlflow").argv, "--artifacts-destination")
    assert destination and Path(destination).is_relative_to(stack_home())
    assert f"artifacts-destination={destination}" in one("minio").argv


def test_ports_are_the_ports_compose_publishes() -> None:
    for service in ("mlflow", "prefect-server", "gateway-lb"):
        assert [one(service).port] == published(service), service
    prod = load_config(CONFIG_DIR / "production.yaml")
    assert prod.serving.database_url and prod.serving.api_keys.storage_uri
    assert one("postgres").port == urlsplit(prod.serving.database_url).port == 5432
    assert one("redis").port == urlsplit(prod.serving.api_keys.storage_uri).port == 6379
    assert published("minio") == [9001] and one("minio").port is None  # MinIO's console: no object store here
    # the clients' port (HAProxy's) is ${GATEWAY_PORT:-3000} in compose; the script reads the same variable
    assert "${GATEWAY_PORT:-3000}" in str(services()["gateway-lb"]["ports"])
    # compose's gateway replicas publish nothing; natively each listens on a port of its own, the one HAProxy names
    replicas = native("gateway")
    assert len(replicas) == services()["gateway"]["deploy"]["replicas"] and published("gateway") == []
    assert len({r.port for r in replicas} | {one("gateway-lb").port}) == len(replicas) + 1
    assert [r.port for r in replicas] == [int(str(flag(r.argv, "--port"))) for r in replicas]
    lb = one("gateway-lb").env
    assert [lb[f"GATEWAY_{i + 1}"] for i in range(len(replicas))] == [f"{NATIVE_HOST}:{r.port}" for r in replicas]
    assert lb["LB_BIND"] == f"{NATIVE_HOST}:{one('gateway-lb').port}"


def test_commands_are_the_compose_commands() -> None:
    def same(service: str, native_argv: list[str], *, drop: tuple[str, ...] = ()) -> None:
        def kept(argv: list[str]) -> list[str]:
            return [a for a in argv if not any(a == d or a.startswith(d + "=") for d in drop)]

        expected = [localized(a).replace("0.0.0.0", NATIVE_HOST) for a in kept(compose_argv(service))]
        got = kept(native_argv)
        got = [Path(got[0]).name, *got[1:]]
        assert got == expected, f"{service}: native {got} vs compose {expected}"

    redis = one("redis").argv
    # compose keeps redis inside its network; here it listens on loopback, on the port the config names
    assert redis[-4:] == ["--bind", NATIVE_HOST, "--port", str(one("redis").port)]
    same("redis", redis[:-4])

    mlflow = list(one("mlflow").argv)
    # the object store -> a folder (checked above); everything else as compose runs it
    same("mlflow", mlflow, drop=("--artifacts-destination",))
    assert str(flag(compose_argv("mlflow"), "--artifacts-destination")).startswith("s3://")
    same("prefect-server", one("prefect-server").argv)

    workers = native("prefect-worker")
    assert workers and [w.process for w in workers] == [f"worker-{i + 1}" for i in range(len(workers))]
    for w in workers:
        assert flag(w.argv, "--name") == w.process  # several workers on one host need names of their own
        argv = [a for i, a in enumerate(w.argv) if a != "--name" and w.argv[i - 1] != "--name"]
        same("prefect-worker", argv)

    # the lifecycle's own commands: the same subcommand and flags, the config being production.yaml localized
    def without_config(argv: list[str]) -> list[str]:
        return [a for i, a in enumerate(argv) if a != "--config" and (i == 0 or argv[i - 1] != "--config")]

    def without_port(argv: list[str]) -> list[str]:  # each native replica's own port (checked above)
        return [a for i, a in enumerate(argv) if a != "--port" and (i == 0 or argv[i - 1] != "--port")]

    for n in [one("scheduler"), one("champion-watch"), *native("gateway")]:
        c = compose_argv(n.service)
        assert Path(n.argv[0]).name == c[0] == "lifecycle"
        assert flag(c, "--config") == "configs/production.yaml"
        assert flag(n.argv, "--config") == str(stack_home() / "lifecycle.yaml")
        assert without_port(without_config(n.argv[1:])) == without_config(c[1:])

    # HAProxy: the same program and flags on the same file (compose mounts infra/haproxy/haproxy.cfg)
    lb, c = one("gateway-lb").argv, compose_argv("gateway-lb")
    (mount,) = [v for v in services()["gateway-lb"]["volumes"] if v.split(":")[1] == flag(c, "-f")]
    assert flag(lb, "-f") == str((INFRA / mount.split(":")[0]).resolve())
    assert [a for a in lb if a != flag(lb, "-f")] == [a for a in c if a != flag(c, "-f")]


def test_environments_are_the_compose_environments() -> None:
    for service, svc in services().items():
        theirs = {k: interpolate(v, example_env()) for k, v in environment(svc).items()}
        for n in native(service):
            if n.process == "-" and service != "trainer":
                continue
            for name, value in theirs.items():
                if name in OBJECT_STORE_ENV:
                    continue  # no object store natively
                assert name in n.env, f"{service}: {name} missing natively"
                if "PASSWORD" in name:
                    assert n.env[name] == "***"  # set, never printed
                elif name == "PREFECT_SERVER_DATABASE_HOST":
                    assert (value, n.env[name]) == ("postgres", NATIVE_HOST)
                elif name == "PREFECT_SERVER_DATABASE_PORT":
                    assert n.env[name] == value == str(one("postgres").port)
                elif service == "gateway-lb":  # addresses: compared with the ports in test_ports_are_...
                    assert value.endswith(":3000") and n.env[name].startswith(f"{NATIVE_HOST}:")
                else:
                    assert n.env[name] == localized(value), f"{service}: {name}={n.env[name]} vs {value}"
            extra = set(n.env) - set(theirs)
            assert extra <= NATIVE_ONLY_ENV, f"{service}: native-only settings {extra - NATIVE_ONLY_ENV}"


def test_the_native_config_is_production_yaml_with_local_addresses(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STACK_") and k != "GATEWAY_PORT"}
    env["STACK_HOME"] = str(stack_home())
    text = subprocess.run(["bash", str(STACK), "config"], capture_output=True, text=True, env=env, check=True).stdout
    (tmp_path / "lifecycle.yaml").write_text(text)
    mine = load_config(tmp_path / "lifecycle.yaml").model_dump(mode="json")
    prod = load_config(CONFIG_DIR / "production.yaml").model_dump(mode="json")
    moved = {
        ("registry", "tracking_uri"),
        ("serving", "host"),
        ("serving", "database_url"),
        ("serving", "api_keys", "storage_uri"),
        ("monitoring", "watch", "host"),
        ("monitoring", "watch", "alertmanager_url"),
    }
    for path in moved:
        a, b = mine, prod
        for key in path[:-1]:
            a, b = a[key], b[key]
        ours, theirs = a.pop(path[-1]), b.pop(path[-1])
        if path in (("serving", "host"), ("monitoring", "watch", "host")):
            assert (theirs, ours) == ("0.0.0.0", NATIVE_HOST)
        else:
            assert ours == localized(theirs), path
    assert mine == prod  # every other setting as compose's gateway and worker get it


def test_postgres_gets_the_databases_and_roles_of_compose(tmp_path: Path) -> None:
    mount = [v for v in services()["postgres"]["volumes"] if "docker-entrypoint-initdb.d" in v]
    script = (INFRA / mount[0].split(":")[0].removeprefix("./")).resolve()
    assert f"init={script.relative_to(REPO)}" in one("postgres").argv
    assert "infra/postgres/init-databases.sh" in STACK.read_text()


@pytest.mark.parametrize(
    "service",
    [
        "mlflow",
        "prefect-server",
        "prefect-worker",
        "gateway",
        "gateway-lb",
        "redis",
        "prometheus",
        "alertmanager",
        "champion-watch",
    ],
)
def test_long_running_services_restart_like_compose(service: str) -> None:
    # compose: restart unless-stopped; the script supervises them (restarts with Docker's back-off)
    assert services()[service].get("restart") == "unless-stopped"
    name = {"prefect-worker": '"worker-$i"', "gateway": '"gateway-$i"'}.get(service, service)
    assert f"supervise {name} " in STACK.read_text()


# compose's images run these binaries; Debian installs them as
DEBIAN_BINARY = {"prometheus": "prometheus", "alertmanager": "prometheus-alertmanager"}


@pytest.mark.parametrize("service", sorted(DEBIAN_BINARY))
def test_prometheus_and_alertmanager_run_like_compose_on_infras_files(service: str, tmp_path: Path) -> None:
    n, c = one(service), compose_argv(service)
    assert n.argv[0] == DEBIAN_BINARY[service] and n.port in published(service)
    assert [a.split("=")[0] for a in n.argv[1:]] == [a.split("=")[0] for a in c]  # the same flags, in order
    assert flag(n.argv, "--web.listen-address") == f"{NATIVE_HOST}:{n.port}"
    assert flag(c, "--web.listen-address") == f"0.0.0.0:{n.port}"
    assert flag(n.argv, "--cluster.listen-address") == flag(c, "--cluster.listen-address")
    for storage in ("--storage.tsdb.path", "--storage.path"):
        if flag(c, storage):
            assert Path(str(flag(n.argv, storage))).is_relative_to(stack_home())
    # the config: compose mounts infra/<folder> read-only; the native copy differs in addresses only
    (mount,) = [v for v in services()[service]["volumes"] if v.startswith("./")]
    source, target = mount.split(":")[:2]
    mounted = INFRA / source.removeprefix("./") / Path(str(flag(c, "--config.file"))).relative_to(target)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STACK_")} | {"STACK_HOME": str(tmp_path)}
    subprocess.run(["bash", str(STACK), "monitoring"], capture_output=True, text=True, env=env, check=True)
    written = Path(str(flag(n.argv, "--config.file")).replace(str(stack_home()), str(tmp_path)))
    native_text, compose_text = written.read_text(), mounted.read_text()
    assert "chat-lifecycle-gateway" not in native_text and "champion-watch:" not in native_text
    addresses = re.compile(r"(\d+\.\d+\.\d+\.\d+|[a-z][\w-]*):\d+")
    native_text = re.sub(r"(?m)^(  - )/\S*/infra/prometheus/", r"\1", native_text)  # the rule files, by path
    assert addresses.sub("ADDR", native_text) == addresses.sub("ADDR", compose_text)


def test_prometheus_scrapes_every_native_replica_and_alerts_reach_the_watch(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STACK_")} | {"STACK_HOME": str(tmp_path)}
    subprocess.run(["bash", str(STACK), "monitoring"], capture_output=True, text=True, env=env, check=True)
    prom = yaml.safe_load((tmp_path / "prometheus" / "prometheus.yml").read_text())
    (job,) = [j for j in prom["scrape_configs"] if j["job_name"] == "gateway"]
    assert job["static_configs"][0]["targets"] == [f"{NATIVE_HOST}:{r.port}" for r in native("gateway")]
    assert prom["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == [
        f"{NATIVE_HOST}:{one('alertmanager').port}"
    ]
    assert all(Path(f).is_file() for f in prom["rule_files"])
    am = yaml.safe_load((tmp_path / "alertmanager" / "alertmanager.yml").read_text())
    url = am["receivers"][0]["webhook_configs"][0]["url"]
    assert url == f"http://{NATIVE_HOST}:{one('champion-watch').port}/alerts"
    assert one("champion-watch").port == load_config(CONFIG_DIR / "production.yaml").monitoring.watch.port
