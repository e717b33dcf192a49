"""Serving commands: ``serve`` (the OpenAI-compatible endpoint) and ``keys`` (its API keys)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from core.errors import ConfigError, LifecycleError
from core.home import Home
from flows.commands.base import Arg, Context, command, stop_on_term
from flows.config import LifecycleConfig

if TYPE_CHECKING:  # serving.state.schema imports SQLAlchemy: a type here, imported by the handler that opens the store
    from serving.state.schema import ApiKey


def check_servable(cfg: LifecycleConfig, home: Home) -> None:
    """Fail in one line before spending half a minute on a server that cannot load its primary version."""
    from flows.stages import open_registry

    routing = cfg.serving.routing
    name = routing.model_name or cfg.registry.model_name
    reg = open_registry(cfg, home)
    try:
        reg.by_alias(name, routing.primary_alias)
    except LifecycleError:
        raise LifecycleError(
            f"no version of {name!r} has the alias {routing.primary_alias!r}, so there is nothing to serve: "
            f"promote a gated version, or serve another alias (--set serving.routing.primary_alias=candidate)"
        ) from None
    for ref in [routing.fallback, *routing.extra]:
        if ref:
            reg.parse(ref)


@command(
    "serve",
    help="start the OpenAI-compatible chat endpoint (BentoML + vLLM) on the versions the registry aliases name",
    example="lifecycle serve\n  lifecycle serve --port 8000 --set serving.routing.fallback=chat@previous-champion\n"
    "  curl -N http://127.0.0.1:3000/v1/chat/completions -H 'Authorization: Bearer lc-...' "
    "-H 'Content-Type: application/json' "
    '-d \'{"model": "chat", "stream": true, "messages": [{"role": "user", "content": "Hi"}]}\'',
    args=[
        Arg("--host", help="interface to bind (default: serving.host, 127.0.0.1)"),
        Arg("--port", type=int, help="port to bind (default: serving.port, 3000; 0 picks a free one)"),
    ],
)
def serve(ctx: Context) -> int:
    from flows.stages import serve_spec
    from serving.launcher import GatewayProcess

    cfg = ctx.config
    updates: dict[str, Any] = {}
    if ctx.args.host:
        updates["host"] = ctx.args.host
    if ctx.args.port is not None:
        updates["port"] = ctx.args.port
    if updates:
        cfg = cfg.model_copy(update={"serving": cfg.serving.model_copy(update=updates)})
    check_servable(cfg, ctx.home)
    gateway = GatewayProcess(serve_spec(cfg, ctx.home))
    print(f"starting the gateway on {gateway.url} (log: {gateway.log_path}) ...", file=sys.stderr)
    stop_on_term()  # Ctrl-C or a TERM to us stops the gateway's whole process group, engines included
    gateway.start()
    try:
        gateway.wait_ready()
        ready = gateway.last_readiness
        ctx.emit(
            {"url": gateway.url, "openai_base_url": gateway.url + "/v1", "log": str(gateway.log_path), **ready},
            [
                f"gateway ready: {gateway.url}  (OpenAI base URL {gateway.url}/v1, chat page {gateway.url}/)",
                f"  serving {ready.get('primary')} as {cfg.serving.routing.served_name!r}"
                + (f", fallback {ready['fallback']}" if ready.get("fallback") else ""),
                f"  log: {gateway.log_path}",
                "  Ctrl-C stops it",
            ],
        )
        ctx.out.flush()
        assert gateway.proc is not None
        return gateway.proc.wait()
    except KeyboardInterrupt:
        print("stopping the gateway ...", file=sys.stderr)
        return 0
    finally:
        gateway.stop()


@command(
    "keys",
    help="manage the endpoint's API keys (stored hashed; the secret is shown once)",
    example="lifecycle keys create my-app --rpm 120 --tpm 50000\n  lifecycle keys list\n  lifecycle keys revoke my-app",
    args=[
        Arg("action", choices=["create", "list", "revoke"], help="what to do"),
        Arg("name", nargs="?", help="create: a name for the key; revoke: its id or name"),
        Arg("--rpm", type=int, help="requests per minute for this key (default: serving.api_keys)"),
        Arg("--tpm", type=int, help="tokens per minute for this key (default: serving.api_keys)"),
        Arg(
            "--training-opt-in",
            action="store_true",
            help="this key's conversations may be curated into training data",
        ),
        Arg("--all", action="store_true", help="list: include revoked keys"),
    ],
)
def keys(ctx: Context) -> int:
    from flows.stages import open_serving_store

    args = ctx.args
    with open_serving_store(ctx.config, ctx.home) as store:
        if args.action == "create":
            if not args.name:
                raise ConfigError("keys create needs a NAME (lifecycle keys create my-app)")
            key, secret = store.create_key(
                args.name,
                requests_per_minute=args.rpm,
                tokens_per_minute=args.tpm,
                training_opt_in=args.training_opt_in,
            )
            ctx.emit(
                {
                    "id": key.id,
                    "name": key.name,
                    "key": secret,
                    "training_opt_in": key.training_opt_in,
                    **key_limits(key),
                },
                [
                    f"created key {key.id} ({key.name}"
                    f"{'; its conversations may be curated into training data' if key.training_opt_in else ''}); "
                    "the secret is shown once:",
                    secret,
                ],
            )
        elif args.action == "list":
            listed = store.list_keys(include_revoked=args.all)
            ctx.emit(
                {"keys": [key_json(k) for k in listed]},
                [f"{'id':<16} {'name':<20} {'prefix':<10} {'rpm':>6} {'tpm':>8} {'training':<8}  status"]
                + [
                    f"{k.id:<16} {k.name:<20} {k.prefix:<10} {k.requests_per_minute or '-':>6} "
                    f"{k.tokens_per_minute or '-':>8} {'opt-in' if k.training_opt_in else '-':<8}  "
                    f"{'revoked' if k.revoked_at else 'active'}"
                    for k in listed
                ],
            )
        else:
            if not args.name:
                raise ConfigError("keys revoke needs the key's id or name (lifecycle keys list shows them)")
            key = store.revoke_key(args.name)
            ctx.emit(key_json(key), [f"revoked key {key.id} ({key.name})"])
    return 0


def key_limits(key: ApiKey) -> dict[str, int | None]:
    return {"requests_per_minute": key.requests_per_minute, "tokens_per_minute": key.tokens_per_minute}


def key_json(key: ApiKey) -> dict[str, Any]:
    return {
        "id": key.id,
        "name": key.name,
        "prefix": key.prefix,
        "created_at": key.created_at.isoformat(),
        "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None,
        "training_opt_in": key.training_opt_in,
        **key_limits(key),
    }
