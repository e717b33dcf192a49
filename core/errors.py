"""The project's one exception tree.

    LifecycleError                 anything the user can fix; the CLI prints its message as one line
    ├── ConfigError                a bad config key or value (CLI exit code 2)
    ├── DataError                  input data that breaks a contract
    │   └── InvalidRecordsError    records rejected by the snapshot contracts, each with file, line, reason
    ├── NotFoundError              a snapshot, model folder or other named thing that does not exist
    ├── ModelError                 a model folder that cannot be used (missing files, wrong architecture)
    ├── TrainingError              a fine-tune whose ranks failed (the message carries the tail of their logs)
    └── RolloutError               a promotion or rollback the deployment state does not allow

Outside the tree, on purpose:

    serving.wire.errors.APIError        the HTTP boundary's OpenAI-shaped errors (status, type, code, param); its own
                                   tree is drawn in ``serving/wire/errors.py``
    serving.engines.engine.EngineDead      an engine process is gone: a signal the router acts on (retry elsewhere),
                                   never shown to a user as such
    training.data.records.RecordInvalid one record breaking a contract, caught by the snapshot builder and gathered into
                                   an ``InvalidRecordsError`` (or counted, with ``--drop-invalid``)

Internal invariants use ``assert``; user input never does.
"""

from __future__ import annotations

from dataclasses import dataclass


class LifecycleError(Exception):
    """Base of every error caused by input the user controls. ``exit_code`` is what the CLI returns."""

    exit_code = 1


class ConfigError(LifecycleError):
    exit_code = 2


class DataError(LifecycleError):
    pass


@dataclass(frozen=True)
class RecordProblem:
    """One rejected record: where it came from and why."""

    source: str
    line: int
    code: str  # short machine-readable kind: invalid_json, schema, role_order, empty_turn, too_long, duplicate...
    reason: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.reason}"


class InvalidRecordsError(DataError):
    """Raised when records break the snapshot contracts and the config says to fail (the default)."""

    def __init__(self, problems: list[RecordProblem], report_path: str | None = None) -> None:
        self.problems = problems
        self.report_path = report_path
        where = f"; full report: {report_path}" if report_path else ""
        first = "; ".join(str(p) for p in problems[:3])
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        super().__init__(
            f"{len(problems)} invalid record(s): {first}{more}{where}. "
            "Fix them, or drop them explicitly with snapshot.on_invalid=drop (--drop-invalid)."
        )


class NotFoundError(LifecycleError):
    pass


class ModelError(LifecycleError):
    pass


class TrainingError(LifecycleError):
    """The fine-tune's ranks failed; the message carries the tail of the rank logs."""


class RolloutError(LifecycleError):
    pass
