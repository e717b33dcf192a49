"""Two gateway replicas behind HAProxy, as production runs them: two ``lifecycle serve`` processes on the tiny
model, sharing API keys, conversations, usage and the request log (a PostgreSQL cluster of the test's own) and the
rate limits (Redis), behind HAProxy on the shipped infra/haproxy/haproxy.cfg (conversation affinity, health
checks, retries). Everything binds 127.0.0.1 on free ports and is stopped by the module's fixture.

In the order they run (one module-scoped stack; the last test kills a replica):
1. a key's requests-per-minute and tokens-per-minute limits hold across both replicas together;
2. a conversation stays on one replica through the balancer, and continues on the other with its history;
3. the rollout controller's canary weight is obeyed by both replicas, conversation by conversation;
4. kill -9 of one replica under load: clients see answers (retried on the survivor by HAProxy) or OpenAI-shaped
   errors, never a broken connection, and every answered request has its request-log row and usage.

    .venv/bin/python -m pytest tests/e2e/test_gateway_replicas.py
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.gateway_helpers import tokens
from support.helpers import engine_overrides, register_serving_versions
from support.postgres_helpers import PostgresCluster, postgres_bin
from support.postgres_helpers import Unavailable as NoPostgres
from support.replica_helpers import LoadBalancer, RedisServer, Replica, require_balancer
from support.stack_helpers import Unavailable, wait_for

from core.home import Home
from flows.config import CONFIG_DIR, LifecycleConfig, load_config
from serving.engines.split import assign

# slow: CI's time (two replicas with their engines take ~3 min to start on 2 cores); `make test-all` runs it
pytestmark = pytest.mark.slow

PROMPT = [{"role": "user", "content": "What is 2 + 2?"}]
CHAMPION, CHALLENGER = "chat/1", "chat/2"  # helpers.register_serving_versions


@dataclass
class Stack:
    lb: LoadBalancer
    replicas: list[Replica]
    key: str  # unlimited
    cfg: LifecycleConfig  # what the replicas run (the controller and the tests read the same databases)
    home: Home
    pg: PostgresCluster
    benign_token_id: int  # pushed by logit_bias, it keeps a generation going to max_tokens

    def post(self, url: str, key: str | None = None, **body: Any) -> httpx.Response:
        payload = {"model": "chat", "messages": PROMPT, "max_tokens": 4, **body}
        headers = {"authorization": f"Bearer {key or self.key}"}
        return httpx.post(url + "/v1/chat/completions", json=payload, headers=headers, timeout=120)

    def full(self, tokens_: int) -> dict[str, Any]:
        """A request that generates exactly ``tokens_`` tokens (uses all it reserves)."""
        return {"max_tokens": tokens_, "logit_bias": {str(self.benign_token_id): 100}}

    def create_key(self, name: str, **limits: int) -> tuple[str, str]:
        from flows.stages import open_serving_store

        with open_serving_store(self.cfg, self.home) as store:
            key, secret = store.create_key(name, **limits)
        return key.id, secret

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        with self.pg.connect("serving") as conn:
            return list(conn.execute(query, params).fetchall())


@pytest.fixture(scope="module")
def stack(
    tiny_config: LifecycleConfig, tiny_base_model: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    try:
        require_balancer()
        bin_dir = postgres_bin()
    except (Unavailable, NoPostgres) as exc:
        pytest.skip(str(exc))
    root = tmp_path_factory.mktemp("replicas")
    home = Home(root / "home")
    base = Path(tiny_base_model.path)
    register_serving_versions(tiny_config, home, base, root / "adapters")
    with contextlib.ExitStack() as es:
        pg = es.enter_context(PostgresCluster.start(bin_dir))
        redis = es.enter_context(RedisServer.start(root))
        config = root / "replicas.yaml"
        config.write_text(
            f"""\
extends: {CONFIG_DIR / "tiny.yaml"}
serving:
  database_url: {pg.create_database("serving")}
  api_keys:
    storage_uri: {redis.url}
  routing:
    refresh_s: 1
  engine:
    max_num_seqs: 8
  brownout:
    enabled: false
rollout:
  steps: [50]
  shadow_min_samples: 0
"""
        )
        overrides = engine_overrides()
        cfg = load_config(config, overrides)
        replicas = [Replica(config, home.root, overrides, root / f"replica-{i}.log") for i in (1, 2)]
        for r in replicas:  # both start at once: two engines load side by side
            es.callback(r.stop)
            r.start()
        for r in replicas:
            r.wait_ready()
        lb = es.enter_context(LoadBalancer.start([r.address for r in replicas], root))
        s = Stack(lb, replicas, "", cfg, home, pg, tokens(base)[2])
        s.key = s.create_key("tests", requests_per_minute=100_000, tokens_per_minute=100_000_000)[1]
        yield s


def replica_name(stack: Stack, replica: Replica) -> str:
    return f"gateway-{stack.replicas.index(replica) + 1}"


def test_a_keys_limits_hold_across_both_replicas_together(stack: Stack) -> None:
    a, b = (r.url for r in stack.replicas)
    # requests per minute: 2 in all, whichever replica counts them
    _, rpm_key = stack.create_key("two-a-minute", requests_per_minute=2)
    assert stack.post(a, rpm_key).status_code == 200
    assert stack.post(b, rpm_key).status_code == 200
    refused = stack.post(a, rpm_key)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "rate_limit_requests"
    assert int(refused.headers["retry-after"]) >= 1

    # tokens per minute: room for two requests of R tokens, not three (each uses all it reserves: nothing is
    # given back), spent on both replicas
    probe = stack.post(a, **stack.full(24))
    assert probe.status_code == 200, probe.text
    r_tokens = probe.json()["usage"]["total_tokens"]
    assert probe.json()["usage"]["completion_tokens"] == 24
    tpm_key_id, tpm_key = stack.create_key("two-requests-of-tokens", tokens_per_minute=2 * r_tokens + r_tokens // 2)
    for url in (a, b):
        r = stack.post(url, tpm_key, **stack.full(24))
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["total_tokens"] == r_tokens
    refused = stack.post(a, tpm_key, **stack.full(24))
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "rate_limit_tokens"

    # one usage ledger and one request log behind both replicas
    usage = httpx.get(b + "/v1/usage", headers={"authorization": f"Bearer {tpm_key}"}, timeout=30).json()["data"]
    assert sum(u["requests"] for u in usage) == 2 and sum(u["total_tokens"] for u in usage) == 2 * r_tokens
    rows = stack.sql("SELECT status, http_status FROM request_log WHERE key_id = %s ORDER BY at", tpm_key_id)
    assert rows == [("ok", 200), ("ok", 200), ("rate_limited", 429)]


def test_a_conversation_stays_on_one_replica_and_continues_on_the_other(stack: Stack) -> None:
    lb = stack.lb.url
    first = stack.post(lb, conversation_id="new")
    assert first.status_code == 200, first.text
    conv, home = first.headers["x-conversation-id"], first.headers["x-gateway-replica"]
    served_by = [home]
    for _ in range(3):
        r = stack.post(lb, conversation_id=conv, messages=[{"role": "user", "content": "And 3 + 3?"}])
        assert r.status_code == 200, r.text
        served_by.append(r.headers["x-gateway-replica"])
    assert served_by == [home] * 4, "the balancer moved a live conversation between replicas"

    # new conversations spread over both replicas
    starts = {stack.post(lb, conversation_id="new").headers["x-gateway-replica"] for _ in range(6)}
    assert starts == {"gateway-1", "gateway-2"}

    # the other replica continues it, with the whole history (PostgreSQL holds it, not the replica)
    other = next(r for r in stack.replicas if replica_name(stack, r) != home)
    r = stack.post(other.url, conversation_id=conv, messages=[{"role": "user", "content": "And 4 + 4?"}])
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] > first.json()["usage"]["prompt_tokens"]  # the history was sent
    history = httpx.get(
        f"{stack.lb.url}/v1/conversations/{conv}", headers={"authorization": f"Bearer {stack.key}"}, timeout=30
    ).json()["messages"]
    assert [m["role"] for m in history] == ["user", "assistant"] * 5
    assert [m["content"] for m in history[::2]] == [
        "What is 2 + 2?",
        "And 3 + 3?",
        "And 3 + 3?",
        "And 3 + 3?",
        "And 4 + 4?",
    ]


def wait_weight(stack: Stack, weight: int, challenger: str | None) -> None:
    def follows(replica: Replica) -> bool:
        dep = (replica.readiness() or {}).get("deployment") or {}
        return dep.get("canary_weight") == weight and dep.get("challenger") == challenger

    for replica in stack.replicas:
        wait_for(f"{replica.address} at canary weight {weight}", partial(follows, replica), 60, 0.5)


def version(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.headers["x-model-version"].split(";")[0]


def test_both_replicas_obey_the_rollout_controllers_weights(stack: Stack) -> None:
    from flows.rollout import open_controller
    from flows.stages import open_registry

    reg = open_registry(stack.cfg, stack.home)
    for v in ("1", "2"):  # gate records the controller accepts (the gate itself is tested elsewhere)
        reg.set_tags("chat", v, {"gate.status": "passed"})
    controller = open_controller(stack.cfg, stack.home, actor="tests")
    decisions = controller.tick()  # accepts the champion, starts the rollout at the first step
    assert (decisions[-1].action, decisions[-1].version, decisions[-1].weight) == ("start", "2", 50), decisions
    wait_weight(stack, 50, CHALLENGER)

    answers: dict[str, list[str]] = {}
    for i in range(12):  # new conversations, alternately on each replica; each continued on the other one
        first, second = stack.replicas[i % 2], stack.replicas[(i + 1) % 2]
        r = stack.post(first.url, conversation_id="new")
        started = version(r)
        conv = r.headers["x-conversation-id"]
        again = stack.post(second.url, conversation_id=conv, messages=[{"role": "user", "content": "Thanks"}])
        answers[conv] = [started, version(again)]
    expected = {c: [CHALLENGER if assign(c, 50) == "challenger" else CHAMPION] * 2 for c in answers}
    assert answers == expected
    assert {v for vs in answers.values() for v in vs} == {CHAMPION, CHALLENGER}  # both variants seen

    # the big red button: weight 0 and the alias gone; both replicas send everyone to the champion again
    controller.rollback(reg.get("chat", "2"), "replica test: rollback")
    wait_weight(stack, 0, None)
    for replica in stack.replicas:
        for _ in range(4):
            assert version(stack.post(replica.url, conversation_id="new")) == CHAMPION


@dataclass
class Outcome:
    sent: float  # time.monotonic() when the request left
    status: int | None  # None: the client got no HTTP answer at all
    replica: str | None
    request_id: str | None
    body: Any
    error: str | None = None


def converse(stack: Stack, key: str, turns: int, out: list[Outcome], stream: bool) -> None:
    """One user: a conversation through the balancer, one turn after the other, streamed or not."""
    conv = "new"
    for _ in range(turns):
        sent = time.monotonic()
        try:
            o = streamed(stack, key, conv, sent) if stream else answered(stack, key, conv, sent)
        except httpx.HTTPError as exc:  # no HTTP answer at all
            o = Outcome(sent, None, None, None, None, f"{type(exc).__name__}: {exc}")
        out.append(o)
        if o.status == 200 and isinstance(o.body, dict) and o.body.get("conversation_id"):
            conv = o.body["conversation_id"]


def answered(stack: Stack, key: str, conv: str, sent: float) -> Outcome:
    r = stack.post(stack.lb.url, key, conversation_id=conv, **stack.full(32))
    body = r.json() if r.headers.get("content-type", "").startswith("application/json") else r.text
    return Outcome(sent, r.status_code, r.headers.get("x-gateway-replica"), r.headers.get("x-request-id"), body)


def streamed(stack: Stack, key: str, conv: str, sent: float) -> Outcome:
    """A streamed turn; ``body["done"]`` says whether the stream ended with ``data: [DONE]`` (it may be cut)."""
    payload = {"model": "chat", "messages": PROMPT, "conversation_id": conv, "stream": True, **stack.full(32)}
    payload["stream_options"] = {"include_usage": True}
    headers = {"authorization": f"Bearer {key}"}
    with httpx.stream("POST", stack.lb.url + "/v1/chat/completions", json=payload, headers=headers, timeout=120) as r:
        replica, request_id = r.headers.get("x-gateway-replica"), r.headers.get("x-request-id")
        if r.status_code != 200:
            r.read()
            return Outcome(sent, r.status_code, replica, request_id, r.json())
        events: list[dict[str, Any]] = []
        done = False
        with contextlib.suppress(httpx.RemoteProtocolError, httpx.ReadError):  # a stream its replica cut
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    events.append(json.loads(line.removeprefix("data: ")))
        usage = next((e["usage"] for e in events if e.get("usage")), None)
        body = {"done": done, "usage": usage, "conversation_id": r.headers.get("x-conversation-id")}
        return Outcome(sent, 200, replica, request_id, body)


def test_kill_9_of_a_replica_under_load_loses_no_answer_and_no_record(stack: Stack) -> None:
    key_id, key = stack.create_key("load", requests_per_minute=100_000, tokens_per_minute=100_000_000)
    victim, survivor = stack.replicas
    victim_name, survivor_name = replica_name(stack, victim), replica_name(stack, survivor)
    outcomes: list[list[Outcome]] = [[] for _ in range(6)]
    streaming = {0, 1}  # two of the six users stream their turns
    users = [
        threading.Thread(target=converse, args=(stack, key, 10, out, i in streaming)) for i, out in enumerate(outcomes)
    ]
    for u in users:
        u.start()
    try:
        # mid-load: the victim has answered some turns and has requests in flight on its engine
        def busy() -> bool:
            answered = sum(o.replica == victim_name and o.status == 200 for out in outcomes for o in out)
            engines = (victim.readiness() or {}).get("engines") or {}
            return answered >= 3 and any(e.get("in_flight", 0) > 0 for e in engines.values())

        wait_for("requests in flight on the victim", busy, 300, 0.05)
        victim.kill()
        # the kill is done once the victim refuses connections: a request sent in between (a few ms under light
        # load, more under heavy) can still have reached it and been cut, and belongs before the kill
        killed = time.monotonic()
    finally:
        for u in users:
            u.join(timeout=600)
    flat = [o for out in outcomes for o in out]
    assert len(flat) == 60

    # clients saw answers or OpenAI-shaped errors, never a dropped connection or an HTML page
    broken = [o for o in flat if o.status is None or not isinstance(o.body, dict)]
    assert not broken, broken
    for o in flat:
        if o.status != 200:
            assert set(o.body["error"]) >= {"message", "type", "param", "code"}, o
    # the requests in flight on the victim were sent again, to the survivor, which answered them: no errors
    assert stack.lb.retried_lines(), "no request was retried: none was in flight on the victim at the kill"
    assert [o for o in flat if o.status != 200] == []
    # a stream cannot be retried once its first bytes are out: one cut by the kill ends without [DONE] (the
    # client can tell it is incomplete and asks again); only streams on the victim, started before the kill
    cut = [o for o in flat if not o.body.get("done", True)]
    assert all(o.replica == victim_name and o.sent < killed for o in cut), cut
    # everything sent after the kill went to the survivor, and the victim's conversations continued there
    after = [o for o in flat if o.sent > killed]
    assert after and {o.replica for o in after} == {survivor_name}
    moved = [
        out
        for out in outcomes
        if any(o.replica == victim_name for o in out) and any(o.replica == survivor_name for o in out)
    ]
    assert moved, "no conversation was on the victim when it died"
    for out in moved:
        assert len({o.body["conversation_id"] for o in out[1:]}) == 1  # one conversation from its second turn on

    # every answered request has its request-log row (status ok, 200, its tokens) in the shared database
    answered = {o.request_id: o.body["usage"] for o in flat if o not in cut}
    rows = {
        rid: (status, http_status, prompt, completion)
        for rid, status, http_status, prompt, completion in stack.sql(
            "SELECT request_id, status, http_status, prompt_tokens, completion_tokens FROM request_log "
            "WHERE key_id = %s",
            key_id,
        )
    }
    for rid, usage in answered.items():
        assert rows.get(rid) == ("ok", 200, usage["prompt_tokens"], usage["completion_tokens"]), rid
    # and usage counts every recorded answer: the answered ones, and any the victim recorded but never sent
    ok_rows = [r for r in rows.values() if r[0] == "ok"]
    assert len(ok_rows) >= len(answered)
    (totals,) = stack.sql(
        "SELECT sum(requests), sum(prompt_tokens), sum(completion_tokens) FROM usage_daily WHERE key_id = %s",
        key_id,
    )
    assert totals == (len(ok_rows), sum(r[2] for r in ok_rows), sum(r[3] for r in ok_rows))
    assert stack.post(survivor.url).status_code == 200  # the survivor still serves
