"""The serving store on SQLite in a temporary folder: keys, tenant isolation, soft delete and purge, usage under
concurrency, a request log that never holds unredacted text, the shadow log, and the in-place upgrade of a
database created by an older release. Raw reads go through ``sqlite3`` so the tests
see what is on disk, not what the store chooses to return."""

from __future__ import annotations

import hashlib
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from support.helpers import assert_erases_log_texts

from core.errors import ConfigError, DataError, NotFoundError
from serving.safety.replies import reply_digest
from serving.state.store import RequestLogEntry, ServingStore, ShadowLogEntry, UsageRow, new_conversation_id


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "nested" / "serving" / "serving.db"  # the parent folders do not exist yet


@pytest.fixture
def store(db_path: Path) -> Iterator[ServingStore]:
    with ServingStore(f"sqlite:///{db_path}") as s:
        yield s


def raw(db_path: Path, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(db_path) as conn:
        return conn.execute(sql).fetchall()


def test_sqlite_is_created_in_wal_mode_with_foreign_keys(store: ServingStore, db_path: Path) -> None:
    assert db_path.is_file()
    assert raw(db_path, "PRAGMA journal_mode") == [("wal",)]  # persistent: stored in the file
    with store._engine.connect() as conn:  # per-connection pragmas
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert (conn.exec_driver_sql("PRAGMA busy_timeout").scalar() or 0) >= 1000


@pytest.mark.parametrize("url", ["not a url", "nosuchdb://host/db"])
def test_a_bad_database_url_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError, match="database_url"):
        ServingStore(url)


# keys


def test_a_key_is_stored_as_a_hash_and_shown_once(store: ServingStore, db_path: Path) -> None:
    key, secret = store.create_key("ci", requests_per_minute=5, training_opt_in=True)
    assert re.fullmatch(r"lc-[A-Za-z0-9_-]{40}", secret)
    assert re.fullmatch(r"key_[a-z0-9]{6,}", key.id) and key.prefix == secret[:8]
    assert key.requests_per_minute == 5 and key.tokens_per_minute is None and key.training_opt_in
    assert key.created_at.tzinfo is UTC
    rows = raw(db_path, "SELECT * FROM api_keys")
    assert len(rows) == 1
    assert hashlib.sha256(secret.encode()).hexdigest() in rows[0]
    assert not any(secret in str(v) for v in rows[0])
    assert store.authenticate(secret) == key
    assert store.authenticate(secret + "x") is None and store.authenticate("") is None


def test_a_revoked_key_no_longer_authenticates(store: ServingStore) -> None:
    key, secret = store.create_key("ci")
    revoked = store.revoke_key("ci")  # by name
    assert revoked.id == key.id and revoked.revoked_at is not None and not revoked.active
    assert store.authenticate(secret) is None
    assert store.list_keys() == []
    assert [k.id for k in store.list_keys(include_revoked=True)] == [key.id]
    assert store.revoke_key(key.id) == revoked  # by id, idempotent


def test_active_key_names_are_unique(store: ServingStore) -> None:
    store.create_key("ci")
    with pytest.raises(ConfigError, match="already exists"):
        store.create_key("ci")
    store.revoke_key("ci")
    store.create_key("ci")  # a revoked key's name can be reused
    assert [k.name for k in store.list_keys()] == ["ci"]


@pytest.mark.parametrize("kwargs", [{"name": " "}, {"name": "x", "requests_per_minute": 0}])
def test_bad_key_settings_are_config_errors(store: ServingStore, kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        store.create_key(**kwargs)  # type: ignore[arg-type]


def test_revoking_an_unknown_key_is_not_found(store: ServingStore) -> None:
    with pytest.raises(NotFoundError, match="no key"):
        store.revoke_key("nobody")


# conversations


def test_a_conversation_keeps_its_turns_in_order(store: ServingStore) -> None:
    conv = store.create_conversation("key_a", "chat", system="be brief")
    assert conv.id.startswith("conv_")
    store.append_messages("key_a", conv.id, [{"role": "user", "content": "hi"}], None)
    store.append_messages("key_a", conv.id, [{"role": "assistant", "content": "hello"}], "chat/3")
    store.append_messages(
        "key_a", conv.id, [{"role": "user", "content": "again"}, {"role": "assistant", "content": "yes"}], "chat/4"
    )
    got = store.get_conversation("key_a", conv.id)
    assert got.system == "be brief" and got.model == "chat"
    assert [(m["role"], m["content"], m.get("model_version")) for m in got.messages] == [
        ("user", "hi", None),
        ("assistant", "hello", "chat/3"),
        ("user", "again", None),
        ("assistant", "yes", "chat/4"),
    ]
    assert all(m["created_at"].tzinfo is UTC for m in got.messages)
    assert got.updated_at >= got.created_at


def test_a_malformed_message_is_refused(store: ServingStore) -> None:
    conv = store.create_conversation("key_a", "chat")
    with pytest.raises(DataError, match="role"):
        store.append_messages("key_a", conv.id, [{"role": "wizard", "content": "x"}], None)


@pytest.mark.parametrize(
    "call",
    [
        lambda s, c: s.get_conversation("key_b", c),
        lambda s, c: s.append_messages("key_b", c, [{"role": "user", "content": "mine now"}], None),
        lambda s, c: s.delete_conversation("key_b", c),
    ],
    ids=["get", "append", "delete"],
)
def test_another_keys_conversation_is_not_found(
    store: ServingStore, call: Callable[[ServingStore, str], object]
) -> None:
    conv = store.create_conversation("key_a", "chat")
    store.append_messages("key_a", conv.id, [{"role": "user", "content": "secret plans"}], None)
    with pytest.raises(NotFoundError, match=f"no conversation {conv.id}"):
        call(store, conv.id)
    assert store.list_conversations("key_b") == []
    assert [m["content"] for m in store.get_conversation("key_a", conv.id).messages] == ["secret plans"]


def test_conversations_are_listed_newest_first_in_pages(store: ServingStore) -> None:
    ids = [store.create_conversation("key_a", "chat").id for _ in range(5)]
    store.create_conversation("key_b", "chat")
    first = store.list_conversations("key_a", limit=2)
    assert [c.id for c in first] == ids[::-1][:2]
    rest = store.list_conversations("key_a", limit=10, before=first[-1].id)
    assert [c.id for c in rest] == ids[::-1][2:]
    with pytest.raises(NotFoundError):
        store.list_conversations("key_b", before=ids[0])  # a cursor of another key


def test_soft_delete_hides_at_once_and_purge_erases_after_retention(store: ServingStore, db_path: Path) -> None:
    kept = store.create_conversation("key_a", "chat")
    gone = store.create_conversation("key_a", "chat")
    store.append_messages("key_a", gone.id, [{"role": "user", "content": "forget me"}], None)
    store.delete_conversation("key_a", gone.id)
    with pytest.raises(NotFoundError):
        store.get_conversation("key_a", gone.id)
    with pytest.raises(NotFoundError):
        store.delete_conversation("key_a", gone.id)
    assert [c.id for c in store.list_conversations("key_a")] == [kept.id]
    now = datetime.now(UTC)
    assert store.purge_deleted(timedelta(days=30), now=now + timedelta(days=29)) == 0
    assert raw(db_path, "SELECT count(*) FROM messages") == [(1,)]  # hidden, not yet erased
    assert store.purge_deleted(timedelta(days=30), now=now + timedelta(days=31)) == 1
    assert raw(db_path, "SELECT id FROM conversations") == [(kept.id,)]
    assert raw(db_path, "SELECT count(*) FROM messages") == [(0,)]


# usage


def test_usage_accumulates_per_utc_day_and_model(store: ServingStore) -> None:
    day1 = datetime(2026, 3, 1, 23, 30, tzinfo=UTC)
    late_local = datetime(2026, 3, 2, 1, 0, tzinfo=UTC).astimezone(ZoneInfo("America/New_York"))
    store.record_usage("key_a", "chat/3", 10, 5, at=day1)
    store.record_usage("key_a", "chat/3", 20, 7, at=day1)
    store.record_usage("key_a", "chat/4", 1, 1, at=day1)
    store.record_usage("key_a", "chat/3", 3, 3, at=late_local)  # 20:00 on March 1 in New York is March 2 UTC
    store.record_usage("key_b", "chat/3", 99, 99, at=day1)
    assert store.usage("key_a") == [
        UsageRow(date(2026, 3, 1), "chat/3", 2, 30, 12),
        UsageRow(date(2026, 3, 1), "chat/4", 1, 1, 1),
        UsageRow(date(2026, 3, 2), "chat/3", 1, 3, 3),
    ]
    assert [r.day for r in store.usage("key_a", start=date(2026, 3, 2))] == [date(2026, 3, 2)]
    assert len(store.usage("key_a", end=date(2026, 3, 1))) == 2
    with pytest.raises(ValueError, match="naive"):
        store.record_usage("key_a", "chat/3", 1, 1, at=datetime(2026, 3, 1))


def test_usage_and_the_request_log_carry_each_answers_cost(store: ServingStore) -> None:
    at = datetime(2026, 3, 1, 12, tzinfo=UTC)
    store.log_answer(entry(at=at, cost_usd=0.125))
    store.log_answer(entry(request_id="chatcmpl-2", at=at, cost_usd=0.25))
    store.log_answer(entry(request_id="chatcmpl-3", at=at, cost_usd=None))  # never reached an engine's accounting
    assert store.usage("key_a") == [UsageRow(date(2026, 3, 1), "chat/3", 3, 36, 12, 0.375)]
    assert [e.cost_usd for e in store.request_log()] == [0.125, 0.25, None]
    with pytest.raises(DataError, match="cost"):
        store.record_usage("key_a", "chat/3", 1, 1, at=at, cost_usd=-1.0)


def test_deleting_a_conversation_and_the_retention_period_erase_log_texts_only(store: ServingStore) -> None:
    assert_erases_log_texts(store)


def test_concurrent_usage_records_add_up_exactly(store: ServingStore) -> None:
    threads, per_thread = 8, 25
    start = threading.Barrier(threads)
    errors: list[BaseException] = []

    def work() -> None:
        start.wait()
        try:
            for _ in range(per_thread):
                store.record_usage("key_a", "chat/3", 3, 2)
        except BaseException as exc:  # surfaced below; a thread's exception is otherwise only printed
            errors.append(exc)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []
    [row] = store.usage("key_a")
    assert (row.requests, row.prompt_tokens, row.completion_tokens) == (200, 600, 400)


def test_concurrent_appends_keep_every_turn(store: ServingStore) -> None:
    conv = store.create_conversation("key_a", "chat")
    start = threading.Barrier(4)

    def work(n: int) -> None:
        start.wait()
        for i in range(10):
            store.append_messages("key_a", conv.id, [{"role": "user", "content": f"{n}-{i}"}], None)

    workers = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    contents = [m["content"] for m in store.get_conversation("key_a", conv.id).messages]
    assert sorted(contents) == sorted(f"{n}-{i}" for n in range(4) for i in range(10))
    for n in range(4):  # each writer's turns stay in its order
        mine = [c for c in contents if c.startswith(f"{n}-")]
        assert mine == [f"{n}-{i}" for i in range(10)]


# request log


def entry(**overrides: object) -> RequestLogEntry:
    base: dict[str, object] = {
        "request_id": "chatcmpl-1",
        "at": datetime(2026, 3, 1, 12, 0, tzinfo=UTC),
        "model": "chat",
        "model_version": "chat/3",
        "status": "ok",
        "http_status": 200,
        "key_id": "key_a",
        "route": "primary",
        "prompt_tokens": 12,
        "completion_tokens": 4,
        "ttft_ms": 80.5,
        "stream": True,
    }
    return RequestLogEntry(**(base | overrides))  # type: ignore[arg-type]


def test_the_request_log_never_stores_unredacted_text(store: ServingStore, db_path: Path) -> None:
    stored = store.log_request(
        entry(
            prompt_text="I am jo@example.com, card 4111 1111 1111 1111",
            response_text="I will call +1 415-555-0100",
        )
    )
    assert stored.prompt_text == "I am [EMAIL], card [CARD]" and stored.redactions == 3
    dump = " ".join(str(v) for row in raw(db_path, "SELECT * FROM request_log") for v in row)
    for secret in ("jo@example.com", "4111", "415-555-0100"):
        assert secret not in dump
    [back] = store.request_log()
    assert back == stored and back.at.tzinfo is UTC and back.stream is True and back.ttft_ms == 80.5


def test_the_request_log_is_read_by_time_and_version(store: ServingStore) -> None:
    t0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    for i in range(6):
        version = "chat/3" if i % 2 else "chat/4"
        store.log_request(entry(request_id=f"r{i}", at=t0 + timedelta(minutes=i), model_version=version))
    assert [e.request_id for e in store.request_log()] == [f"r{i}" for i in range(6)]
    assert [e.request_id for e in store.request_log(since=t0 + timedelta(minutes=3))] == ["r3", "r4", "r5"]
    assert [e.request_id for e in store.request_log(model_version="chat/3")] == ["r1", "r3", "r5"]
    assert [e.request_id for e in store.request_log(limit=2)] == ["r4", "r5"]  # the latest, oldest first


def test_the_request_log_keeps_the_assigned_version_and_the_refusal(store: ServingStore) -> None:
    store.log_request(entry(request_id="a", route="canary-unavailable", assigned_version="chat/5", refusal=True))
    store.log_request(entry(request_id="b"))
    a, b = store.request_log()
    assert (a.model_version, a.assigned_version, a.route, a.refusal) == ("chat/3", "chat/5", "canary-unavailable", True)
    assert (b.assigned_version, b.refusal) == (None, None)


def test_the_request_log_knows_the_replies_by_digest_until_their_texts_are_erased(store: ServingStore) -> None:
    """What every replica reads to know an assistant turn as one of the gateway's replies (serving.safety.replies)."""
    a, b = reply_digest("first reply"), reply_digest("second reply")
    store.log_request(entry(request_id="a", at=datetime(2026, 1, 1, tzinfo=UTC), reply_digest=a))
    store.log_request(entry(request_id="b", reply_digest=b))
    store.log_request(entry(request_id="c", reply_digest=b))
    assert store.known_replies([a, b, reply_digest("forged")]) == {a, b} and store.known_replies([]) == set()
    assert [e.reply_digest for e in store.request_log()] == [a, b, b]
    store.erase_old_log_texts(timedelta(days=30), now=datetime(2026, 3, 15, tzinfo=UTC))
    assert store.known_replies([a, b]) == {b}


def test_a_conversation_id_made_beforehand_is_used(store: ServingStore) -> None:
    conv_id = new_conversation_id()
    assert re.fullmatch(r"conv_[0-9a-f]{24}", conv_id)
    conv = store.create_conversation("key_a", "chat", conversation_id=conv_id)
    assert conv.id == conv_id
    assert store.get_conversation("key_a", conv_id).id == conv_id


# shadow log


def shadow_entry(**overrides: object) -> ShadowLogEntry:
    base: dict[str, object] = {
        "request_id": "chatcmpl-1",
        "at": datetime(2026, 3, 1, 12, 0, tzinfo=UTC),
        "primary_version": "chat/2",
        "shadow_version": "chat/4",
        "status": "ok",
        "primary_tokens": 10,
        "shadow_tokens": 12,
        "length_ratio": 1.25,
        "primary_refusal": False,
        "shadow_refusal": True,
        "primary_toxicity": 0.01,
        "shadow_toxicity": 0.2,
        "similarity": 0.83,
        "primary_ttft_ms": 40.0,
        "shadow_ttft_ms": 55.5,
        "primary_e2e_ms": 400.0,
        "shadow_e2e_ms": 480.0,
    }
    return ShadowLogEntry(**(base | overrides))  # type: ignore[arg-type]


def test_the_shadow_log_round_trips_and_is_read_by_time_and_version(store: ServingStore) -> None:
    t0 = datetime(2026, 3, 1, 12, 0, tzinfo=ZoneInfo("Europe/Berlin"))
    first = store.log_shadow(shadow_entry(at=t0))
    assert first.at.tzinfo is UTC
    assert store.shadow_log() == [first]
    for i in range(1, 5):
        store.log_shadow(
            shadow_entry(
                request_id=f"r{i}",
                at=t0 + timedelta(minutes=i),
                shadow_version="chat/5" if i % 2 else "chat/4",
                status="error" if i == 4 else "ok",
                error="RuntimeError: boom" if i == 4 else None,
                similarity=None if i == 4 else 0.5,
            )
        )
    assert [e.request_id for e in store.shadow_log(shadow_version="chat/5")] == ["r1", "r3"]
    assert [e.request_id for e in store.shadow_log(since=t0 + timedelta(minutes=3))] == ["r3", "r4"]
    assert [e.request_id for e in store.shadow_log(limit=2)] == ["r3", "r4"]
    last = store.shadow_log()[-1]
    assert (last.status, last.error, last.similarity) == ("error", "RuntimeError: boom", None)


OLD_REQUEST_LOG = """
CREATE TABLE request_log (
    id INTEGER NOT NULL PRIMARY KEY, request_id VARCHAR(100) NOT NULL, at DATETIME NOT NULL, key_id VARCHAR(64),
    model VARCHAR(200) NOT NULL, model_version VARCHAR(200), alias VARCHAR(200), route VARCHAR(40),
    status VARCHAR(40) NOT NULL, http_status INTEGER NOT NULL, prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL, ttft_ms FLOAT, tpot_ms FLOAT, e2e_ms FLOAT, stream BOOLEAN NOT NULL,
    pre_filter VARCHAR(200), post_filter VARCHAR(200), conversation_id VARCHAR(40), prompt_text TEXT,
    response_text TEXT, finish_reason VARCHAR(40), error TEXT, redactions INTEGER NOT NULL
)"""
OLD_USAGE = """
CREATE TABLE usage_daily (
    key_id VARCHAR(64) NOT NULL, model VARCHAR(200) NOT NULL, day DATE NOT NULL, requests INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, PRIMARY KEY (key_id, model, day)
)"""


def test_a_database_of_the_old_schema_gets_the_new_columns_on_open(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    with sqlite3.connect(db_path) as conn:  # what a gateway of the previous release left behind
        conn.execute(OLD_REQUEST_LOG)
        conn.execute(OLD_USAGE)
        conn.execute("INSERT INTO usage_daily VALUES ('key_a', 'chat/2', '2026-11-20', 1, 5, 3)")
        conn.execute(
            "INSERT INTO request_log (request_id, at, model, model_version, route, status, http_status, "
            "prompt_tokens, completion_tokens, stream, redactions) "
            "VALUES ('old', '2026-11-20 10:00:00.000000', 'chat', 'chat/2', 'primary', 'ok', 200, 5, 3, 0, 0)"
        )
    for _ in range(2):  # idempotent: the second open finds nothing to add
        with ServingStore(f"sqlite:///{db_path}") as store:
            columns = [row[1] for row in raw(db_path, "PRAGMA table_info(request_log)")]
            assert {"assigned_version", "refusal", "cost_usd", "reply_digest"} <= set(columns)
            # the usage rows from before cost accounting read back as costing nothing (the column's server default)
            assert store.usage("key_a") == [UsageRow(date(2026, 11, 20), "chat/2", 1, 5, 3, 0.0)]
            old = store.request_log()[0]
            assert (old.request_id, old.model_version, old.assigned_version, old.refusal) == (
                "old",
                "chat/2",
                None,
                None,
            )
    with ServingStore(f"sqlite:///{db_path}") as store:
        at = datetime(2026, 11, 21, tzinfo=UTC)
        store.log_request(entry(request_id="new", at=at, assigned_version="chat/5", refusal=False))
        assert [(e.request_id, e.assigned_version, e.refusal) for e in store.request_log()] == [
            ("old", None, None),
            ("new", "chat/5", False),
        ]
        store.log_shadow(shadow_entry())  # the new table was created next to the old ones
        assert len(store.shadow_log()) == 1


def test_text_with_nul_characters_is_stored_as_on_postgres(store: ServingStore) -> None:
    from support.helpers import assert_stores_nul_text

    assert_stores_nul_text(store)  # tests/integration/test_postgres.py runs the same on PostgreSQL


def test_an_answers_usage_and_log_row_are_written_together_or_not_at_all(store: ServingStore) -> None:
    from dataclasses import replace

    from sqlalchemy.exc import IntegrityError

    key, _ = store.create_key("answers")
    entry = RequestLogEntry(
        request_id="req_1",
        at=datetime.now(UTC),
        key_id=key.id,
        model="chat",
        model_version="chat/1",
        status="ok",
        http_status=200,
        prompt_tokens=3,
        completion_tokens=4,
        response_text="mail bob@example.org",
    )
    assert store.log_answer(entry).response_text == "mail [EMAIL]"  # redacted like log_request
    with pytest.raises(IntegrityError):  # the log row cannot be written (status is NOT NULL) ...
        store.log_answer(replace(entry, request_id="req_2", status=None))  # type: ignore[arg-type]
    # ... so its usage was not counted either
    assert [(u.model, u.requests, u.prompt_tokens, u.completion_tokens) for u in store.usage(key.id)] == [
        ("chat/1", 1, 3, 4)
    ]
    assert [r.request_id for r in store.request_log()] == ["req_1"]
