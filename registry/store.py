"""The MLflow model registry behind one class: runs, registered versions, lineage tags, aliases, loading back.

    reg = MlflowRegistry(cfg, home)
    version = reg.register(name, run_id, "model", tags={"lineage.snapshot": ...})
    reg.set_alias("chat", "candidate", version.version, reason="trained by flow run ...")
    folder = reg.resolve("chat@candidate")        # or "chat/3": a local folder with the model files

Only ``registry/`` imports MLflow. Everything goes through an ``MlflowClient`` instance (no global tracking
URI), so two registries in one process do not interfere. The default store is SQLite with artifacts under
``$LIFECYCLE_HOME/mlflow``; any MLflow server URI works the same.

Alias moves are state changes that matter: each one tags the version with the reason, time and actor
(``alias.<alias>.reason`` ...) and appends a line to ``$LIFECYCLE_HOME/mlflow/audit.jsonl``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param
from mlflow.exceptions import MlflowException

from core.errors import ConfigError, NotFoundError
from core.home import Home
from registry.config import RegistryConfig

log = logging.getLogger("lifecycle.registry")
REF_PATTERN = re.compile(r"^(?:models:/)?(?P<name>[^@/]+)(?:@(?P<alias>[\w-]+)|/(?P<version>\d+))$")
_MAX_PARAM = 6000


@dataclass(frozen=True)
class ModelVersion:
    name: str
    version: str
    run_id: str | None
    source: str
    tags: dict[str, str] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()

    @property
    def ref(self) -> str:
        return f"{self.name}/{self.version}"

    @property
    def lineage(self) -> dict[str, str]:
        return {k.removeprefix("lineage."): v for k, v in sorted(self.tags.items()) if k.startswith("lineage.")}


def flatten(obj: Any, prefix: str = "") -> dict[str, str]:
    """Nested config -> {"a.b.c": "value"} for MLflow params."""
    out: dict[str, str] = {}
    if isinstance(obj, dict):
        for key, value in obj.items():
            out.update(flatten(value, f"{prefix}{key}."))
    else:
        out[prefix.rstrip(".")] = json.dumps(obj) if isinstance(obj, list | bool | None) else str(obj)
    return out


def local_tracking_uri(home: Home) -> str:
    """The embedded default store: SQLite under ``$LIFECYCLE_HOME/mlflow`` (artifacts next to it)."""
    return f"sqlite:///{home.mlflow / 'mlflow.db'}"


class MlflowRegistry:
    def __init__(self, cfg: RegistryConfig, home: Home) -> None:
        self.cfg = cfg
        self.home = home
        home.mlflow.mkdir(parents=True, exist_ok=True)
        self.tracking_uri = cfg.tracking_uri or local_tracking_uri(home)
        self.client = MlflowClient(tracking_uri=self.tracking_uri, registry_uri=cfg.registry_uri or self.tracking_uri)
        self._experiment_id: str | None = None

    # --- runs ---------------------------------------------------------------------------------------------

    def experiment_id(self) -> str:
        if self._experiment_id is None:
            exp = self.client.get_experiment_by_name(self.cfg.experiment)
            if exp is None:
                local = not self.cfg.tracking_uri
                location = (self.home.mlflow / "artifacts").as_uri() if local else None
                self._experiment_id = self.client.create_experiment(self.cfg.experiment, artifact_location=location)
            else:
                self._experiment_id = exp.experiment_id
        return self._experiment_id

    def log_run(
        self,
        *,
        run_name: str,
        params: dict[str, Any],
        metrics: list[dict[str, Any]],
        artifacts: dict[str, Path],
        tags: dict[str, str],
    ) -> str:
        """One finished MLflow run: params (flattened), per-step metrics, files/folders as artifacts."""
        run = self.client.create_run(self.experiment_id(), run_name=run_name, tags=tags)
        run_id = run.info.run_id
        try:
            flat = [Param(k[:250], v[:_MAX_PARAM]) for k, v in flatten(params).items()]
            for i in range(0, len(flat), 100):
                self.client.log_batch(run_id, params=flat[i : i + 100])
            now = int(datetime.now(UTC).timestamp() * 1000)
            points = [
                Metric(k, float(v), now, int(row.get("step", 0)))
                for row in metrics
                for k, v in row.items()
                if k != "step" and isinstance(v, int | float)
            ]
            for i in range(0, len(points), 1000):
                self.client.log_batch(run_id, metrics=points[i : i + 1000])
            for artifact_path, local in artifacts.items():
                if local.is_dir():
                    self.client.log_artifacts(run_id, str(local), artifact_path)
                else:
                    self.client.log_artifact(run_id, str(local), artifact_path or None)
        except BaseException:
            self.client.set_terminated(run_id, "FAILED")
            raise
        self.client.set_terminated(run_id, "FINISHED")
        return run_id

    def open_run(self, *, run_name: str, tags: dict[str, str], params: dict[str, Any] | None = None) -> str:
        """A run left open for metrics logged over time (a rollout logs one step per analysis)."""
        run_id = self.client.create_run(self.experiment_id(), run_name=run_name, tags=tags).info.run_id
        flat = [Param(k[:250], v[:_MAX_PARAM]) for k, v in flatten(params or {}).items()]
        for i in range(0, len(flat), 100):
            self.client.log_batch(run_id, params=flat[i : i + 100])
        return run_id

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int) -> None:
        now = int(datetime.now(UTC).timestamp() * 1000)
        points = [Metric(k[:250], float(v), now, step) for k, v in metrics.items()]
        for i in range(0, len(points), 1000):
            self.client.log_batch(run_id, metrics=points[i : i + 1000])

    def set_run_tags(self, run_id: str, tags: dict[str, str]) -> None:
        for key, value in tags.items():
            self.client.set_tag(run_id, key, value[:_MAX_PARAM])

    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status)

    # --- versions -----------------------------------------------------------------------------------------

    def register(
        self, name: str, run_id: str, artifact_path: str, tags: dict[str, str], description: str = ""
    ) -> ModelVersion:
        try:
            self.client.get_registered_model(name)
        except MlflowException:
            self.client.create_registered_model(name, description=description or None)
        source = f"{self.client.get_run(run_id).info.artifact_uri}/{artifact_path}"
        mv = self.client.create_model_version(name, source=source, run_id=run_id, tags=tags)
        log.info("registered %s/%s", name, mv.version)
        return self.get(name, str(mv.version))

    def get(self, name: str, version: str) -> ModelVersion:
        try:
            mv = self.client.get_model_version(name, version)
        except MlflowException:
            raise NotFoundError(f"no model version {name}/{version} in the registry ({self.tracking_uri})") from None
        return _version(mv)

    def by_alias(self, name: str, alias: str) -> ModelVersion:
        try:
            return _version(self.client.get_model_version_by_alias(name, alias))
        except MlflowException:
            raise NotFoundError(f"no version of {name!r} has the alias {alias!r}") from None

    def find(self, name: str, **tags: str) -> list[ModelVersion]:
        """Versions of ``name`` whose tags equal the given values (``lineage_train_key=...`` means
        ``lineage.train_key``), newest first."""
        try:
            self.client.get_registered_model(name)
        except MlflowException:
            return []
        clauses = [f"name = '{name}'"] + [f"tags.`{k.replace('_', '.', 1)}` = '{v}'" for k, v in tags.items()]
        found = self.client.search_model_versions(" and ".join(clauses))
        return sorted((_version(mv) for mv in found), key=lambda v: -int(v.version))

    def parse(self, ref: str) -> ModelVersion:
        """``name@alias``, ``name/version`` or ``models:/...`` to the version it names."""
        name, alias, version = parse_ref(ref)
        return self.by_alias(name, alias) if alias else self.get(name, str(version))

    def resolve(self, ref: str) -> Path:
        """A local folder with the version's files (downloaded once into the home cache)."""
        mv = self.parse(ref)
        target = self.home.cache / "models" / mv.name / mv.version
        if (target / ".complete").is_file():
            return target
        if not mv.run_id:
            raise NotFoundError(f"{mv.ref} has no MLflow run; only versions registered from runs can be loaded")
        run_root = self.client.get_run(mv.run_id).info.artifact_uri.rstrip("/")
        relative = mv.source.removeprefix(run_root).strip("/")
        tmp = Path(tempfile.mkdtemp(prefix=f".{mv.name}-{mv.version}-", dir=self.home.tmp()))
        try:
            local = Path(self.client.download_artifacts(mv.run_id, relative, str(tmp)))
            (local / ".complete").write_text(mv.source + "\n")
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():
                shutil.rmtree(target)
            local.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return target

    def deployment(self, name: str) -> Deployment:
        """Aliases and traffic tags of ``name`` (empty when it is not registered yet)."""
        try:
            rm = self.client.get_registered_model(name)
        except MlflowException:
            return Deployment(name, {}, {})
        aliases = {alias: str(version) for alias, version in (rm.aliases or {}).items()}
        return Deployment(name, aliases, dict(rm.tags or {}))

    def set_model_tags(self, name: str, tags: dict[str, str]) -> None:
        """Tags on the registered model itself (deployment-wide settings like the canary weight)."""
        for key, value in tags.items():
            self.client.set_registered_model_tag(name, key, value)

    def set_tags(self, name: str, version: str, tags: dict[str, str]) -> None:
        for key, value in tags.items():
            self.client.set_model_version_tag(name, version, key, value)

    def delete_tags(self, name: str, version: str, keys: list[str]) -> None:
        for key in keys:
            with contextlib.suppress(MlflowException):
                self.client.delete_model_version_tag(name, version, key)

    # --- aliases ------------------------------------------------------------------------------------------

    def set_alias(self, name: str, alias: str, version: str, *, reason: str, actor: str) -> None:
        """Point ``alias`` at ``version``, tag the version with why, and append an audit-log entry."""
        previous = None
        with contextlib.suppress(MlflowException):
            previous = str(self.client.get_model_version_by_alias(name, alias).version)
        self.client.set_registered_model_alias(name, alias, version)
        now = datetime.now(UTC).isoformat(timespec="seconds")
        self.set_tags(
            name, version, {f"alias.{alias}.reason": reason, f"alias.{alias}.at": now, f"alias.{alias}.by": actor}
        )
        self._audit(
            {"at": now, "by": actor, "model": name, "alias": alias, "from": previous, "to": version, "reason": reason}
        )

    def remove_alias(self, name: str, alias: str, *, reason: str, actor: str) -> str | None:
        """Delete ``alias`` (if set), tag the version it pointed at with why, and audit it; returns that version."""
        try:
            previous = str(self.client.get_model_version_by_alias(name, alias).version)
        except MlflowException:
            return None
        self.client.delete_registered_model_alias(name, alias)
        now = datetime.now(UTC).isoformat(timespec="seconds")
        self.set_tags(
            name,
            previous,
            {
                f"alias.{alias}.removed_reason": reason,
                f"alias.{alias}.removed_at": now,
                f"alias.{alias}.removed_by": actor,
            },
        )
        self._audit(
            {"at": now, "by": actor, "model": name, "alias": alias, "from": previous, "to": None, "reason": reason}
        )
        return previous

    def _audit(self, entry: dict[str, Any]) -> None:
        with (self.home.mlflow / "audit.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")

    def audit_log(self) -> list[dict[str, Any]]:
        path = self.home.mlflow / "audit.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


@dataclass(frozen=True)
class Deployment:
    """What a registered model deploys right now: its aliases and the traffic settings kept as registered-model
    tags (one ``get_registered_model`` call, so a reader sees aliases and weights of the same moment)."""

    name: str
    aliases: dict[str, str]  # "champion" -> "3"
    tags: dict[str, str]

    @property
    def canary_weight(self) -> int:
        """Percent of the served name's traffic for the ``challenger`` alias (0 while it only shadows)."""
        try:
            return max(0, min(100, int(self.tags.get(CANARY_WEIGHT_TAG, "0"))))
        except ValueError:
            return 0


CANARY_WEIGHT_TAG = "rollout.weight"


def parse_ref(ref: str) -> tuple[str, str | None, str | None]:
    """``chat@champion`` -> ("chat", "champion", None); ``chat/3`` or ``models:/chat/3`` -> ("chat", None, "3")."""
    m = REF_PATTERN.match(ref.strip())
    if not m:
        raise ConfigError(f"model reference {ref!r}: use NAME@ALIAS or NAME/VERSION (like chat@champion, chat/3)")
    return m["name"], m["alias"], m["version"]


def _version(mv: Any) -> ModelVersion:
    return ModelVersion(
        name=mv.name,
        version=str(mv.version),
        run_id=mv.run_id,
        source=mv.source,
        tags=dict(mv.tags or {}),
        aliases=tuple(getattr(mv, "aliases", ()) or ()),
    )
