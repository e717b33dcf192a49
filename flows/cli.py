"""The ``lifecycle`` command line: one subcommand per stage, built on the same functions the flows call.

    lifecycle run                                  # the whole loop on the default config
    lifecycle snapshot --json                      # build (or find) the data snapshot, print its hash
    lifecycle bootstrap --config configs/tiny.yaml # tokenizer + small base model, offline
    lifecycle config --set snapshot.test_fraction=0.2

Every subcommand takes ``--config FILE``, ``--set KEY=VALUE`` (repeatable), ``--home DIR`` and ``--json``.
User errors are one line on stderr (exit 2 for config and usage errors, 1 for the rest); unexpected errors are
one line plus a log file holding the traceback.

The commands are declared next to their handlers in ``flows/commands/`` (``base.command``); this module collects
them (in the order of ``GROUPS``, which is the order of ``lifecycle --help``), builds the parser and runs one.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import traceback
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

from core.errors import ConfigError, LifecycleError
from core.home import Home
from flows.commands import data, loop, models, ops, rollout, safety, serve
from flows.commands.base import Command, Context, Parser

PROG = "lifecycle"
GROUPS: tuple[ModuleType, ...] = (loop, models, serve, rollout, ops, data, safety)


def collect(groups: Sequence[ModuleType]) -> dict[str, Command]:
    """Every ``Command`` the modules declare, in their order and, within one, in the order they are written."""
    found = [value for module in groups for value in vars(module).values() if isinstance(value, Command)]
    return {c.name: c for c in found}


COMMANDS: dict[str, Command] = collect(GROUPS)


def build_parser() -> argparse.ArgumentParser:
    common = Parser(add_help=False)
    common.add_argument("--config", metavar="FILE", help="config file (default: configs/default.yaml)")
    common.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override a config key, e.g. --set snapshot.test_fraction=0.2 (repeatable)",
    )
    common.add_argument("--home", metavar="DIR", help="state folder (default: $LIFECYCLE_HOME or ./.lifecycle)")
    common.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")

    parser = Parser(
        prog=PROG,
        description="chat-lifecycle: data snapshots -> fine-tune -> registry -> "
        "gated evals -> canary rollouts -> drift-triggered retraining.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  lifecycle run\n  lifecycle snapshot --json\n"
        "  lifecycle bootstrap --config configs/tiny.yaml",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name, command in COMMANDS.items():
        p = sub.add_parser(
            name,
            parents=[common],
            help=command.help,
            description=command.help,
            epilog="example:\n  " + command.example,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.set_defaults(func=command)
        for arg in command.args:
            p.add_argument(*arg.flags, **arg.options)
    return parser


def _log_crash(home: Home | None) -> Path:
    root = home.logs if home else Path.cwd()
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"cli-error-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.log"
    path.write_text(traceback.format_exc(), encoding="utf-8")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    ctx: Context | None = None
    stdout = out = sys.stdout
    saved_fd: int | None = None
    if args.json:  # stdout carries the JSON alone: libraries that log to stdout are sent to stderr meanwhile
        saved_fd = _stdout_to_stderr()
        if saved_fd is not None:
            out = os.fdopen(os.dup(saved_fd), "w", encoding="utf-8")
        sys.stdout = sys.stderr
    try:
        ctx = Context(args, out)
        return int(args.func(ctx))
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return exc.exit_code
    except LifecycleError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug, not bad input: one line here, the traceback in a log file
        if os.environ.get("LIFECYCLE_DEBUG"):
            raise
        log = _log_crash(ctx.home if ctx else None)
        print(f"{PROG}: internal error: {type(exc).__name__}: {exc} (traceback: {log})", file=sys.stderr)
        return 1
    finally:
        sys.stdout = stdout
        if saved_fd is not None:
            out.close()
            os.dup2(saved_fd, stdout.fileno())
            os.close(saved_fd)


def _stdout_to_stderr() -> int | None:
    """Point file descriptor 1 at stderr (so child processes, such as vLLM's engine core, cannot write into the
    JSON either) and return a copy of the original; None when stdout is not a real file (a test capture)."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, io.UnsupportedOperation):
        return None
    sys.stdout.flush()
    saved = os.dup(fd)
    os.dup2(sys.stderr.fileno(), fd)
    return saved


if __name__ == "__main__":
    sys.exit(main())
