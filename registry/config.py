"""Registry settings: where MLflow lives and what the registered models are called."""

from __future__ import annotations

from pydantic import Field

from core.config import StrictModel


class RegistryConfig(StrictModel):
    tracking_uri: str | None = Field(
        None,
        description="MLflow tracking URI (an MLflow server, or a database URI); "
        "null: SQLite under $LIFECYCLE_HOME/mlflow.",
    )
    registry_uri: str | None = Field(None, description="MLflow registry URI; null: the tracking URI.")
    experiment: str = Field("chat-lifecycle", description="MLflow experiment that holds training runs.")
    model_name: str = Field("chat", description="Registered model of the fine-tuned chat versions.")
    base_model_name: str = Field("chat-base", description="Registered model of the base models they start from.")
