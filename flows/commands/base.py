"""What every ``lifecycle`` command is built from: its declaration (``command``), the ``Context`` it runs in, and
``Arg``, one argparse argument.

    @command(
        "train",
        help="fine-tune with DeepSpeed and register the version in MLflow (a Prefect flow)",
        example="lifecycle train --config configs/tiny.yaml",
        args=[Arg("--snapshot", metavar="HASH", help="train on this existing snapshot (hash or prefix)")],
    )
    def train(ctx: Context) -> int: ...

Handlers return the exit code. They import the flows they run inside their body, after ``Context`` has
configured the process (docs/architecture.md, "The import rule").
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TextIO

from core import runtime
from core.home import Home
from flows.config import LifecycleConfig, load_config


class Context:
    """What every command gets: the resolved config, the home folder and the output mode. Building it configures
    the process (``core.runtime.configure``: offline, telemetry off, caches and Prefect's home under the home)."""

    def __init__(self, args: argparse.Namespace, out: TextIO) -> None:
        self.args = args
        self.out = out
        self.config: LifecycleConfig = load_config(Path(args.config) if args.config else None, args.set)
        self.home: Home = self.config.resolve_home(args.home)
        self.json: bool = args.json
        runtime.configure(self.home)

    def emit(self, payload: dict[str, Any], human: Sequence[str]) -> None:
        if self.json:
            print(json.dumps(payload, indent=2, default=str), file=self.out)
        else:
            print("\n".join(human), file=self.out)


Handler = Callable[[Context], int]


@dataclass(frozen=True)
class Arg:
    """One ``add_argument`` call: ``Arg("--rate", type=float, default=4.0, help="...")``."""

    flags: tuple[str, ...]
    options: dict[str, Any] = field(default_factory=dict)

    def __init__(self, *flags: str, **options: Any) -> None:
        object.__setattr__(self, "flags", flags)
        object.__setattr__(self, "options", options)


@dataclass(frozen=True)
class Command:
    """A subcommand: its name, one-line help (also its description), the example shown in ``--help``, its own
    arguments (besides the common ``--config``, ``--set``, ``--home``, ``--json``) and its handler."""

    name: str
    help: str
    example: str
    handler: Handler
    args: tuple[Arg, ...] = ()

    def __call__(self, ctx: Context) -> int:
        return self.handler(ctx)


def command(name: str, *, help: str, example: str, args: Sequence[Arg] = ()) -> Callable[[Handler], Command]:  # noqa: A002
    """Declare a subcommand on its handler; the module's ``Command`` objects are what ``flows.cli`` collects."""

    def declare(handler: Handler) -> Command:
        return Command(name, help, example, handler, tuple(args))

    return declare


class Parser(argparse.ArgumentParser):
    """Usage errors as one line (exit 2), pointing at ``--help``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def stop_on_term() -> None:
    """A TERM to us (a process manager, ``kill``) ends the command like Ctrl-C: servers stopped by group."""
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))


def say(line: str) -> None:
    """Progress for people, on stderr (stdout carries the result, or the JSON)."""
    print(line, file=sys.stderr, flush=True)
