"""``lifecycle watch``: the champion watch's HTTP receiver, the webhook Alertmanager posts to
(infra/alertmanager/alertmanager.yml). A small stdlib server, one request at a time (alerts are rare, and one at a
time means two rollbacks never race):

    POST /alerts    Alertmanager's webhook payload -> 200 {"decisions": [...]}; 400 OpenAI-shaped on bad JSON
    GET  /healthz   200 once it listens

Each alert goes to ``monitoring.watch.ChampionWatch`` (recorded on the champion, rollback on a severe breach soon
after a promotion), which uses the rollout controller's registry, run log and rollback path.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from core.home import Home
from flows.config import LifecycleConfig
from flows.rollout import open_controller
from monitoring.watch import ChampionWatch, parse_webhook

log = logging.getLogger("lifecycle.watch")


def open_watch(cfg: LifecycleConfig, home: Home, actor: str = "champion-watch") -> ChampionWatch:
    return ChampionWatch(open_controller(cfg, home, actor=actor), cfg.monitoring.watch)


def watch_server(watch: ChampionWatch, host: str, port: int) -> HTTPServer:
    """The receiver bound to ``host:port`` (0: a free port); ``serve_forever`` runs it."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path == "/healthz":
                self._reply(200, {"status": "ok"})
            else:
                self._error(404, f"no route {self.path}", "not_found")

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/alerts":
                self._error(404, f"no route {self.path}", "not_found")
                return
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
                alerts = parse_webhook(body if isinstance(body, dict) else {})
            except ValueError as exc:
                self._error(400, f"invalid webhook payload: {exc}", "invalid_payload")
                return
            decisions = watch.handle(alerts)
            self._reply(200, {"decisions": [asdict(d) for d in decisions]})

        def _error(self, status: int, message: str, code: str) -> None:
            error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
            self._reply(status, {"error": error})

        def _reply(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload, default=str).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
            log.info("%s %s", self.address_string(), format % args)

    return HTTPServer((host, port), Handler)


@contextmanager
def running_watch(watch: ChampionWatch, host: str, port: int) -> Iterator[str]:
    """The receiver on a thread of this process; yields its base URL, stops it on exit."""
    server = watch_server(watch, host, port)
    thread = threading.Thread(target=server.serve_forever, name="champion-watch", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
