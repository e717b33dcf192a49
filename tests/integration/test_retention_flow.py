"""The log-retention flow, run by Prefect as its deployment runs it (the in-process test harness): the serving
database of the home loses the texts of rows older than ``serving.log_text_retention_days``, keeps their numbers and
the texts of newer rows, and a second run finds nothing left to erase."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from core.home import Home
from flows.config import CONFIG_DIR, load_config
from flows.retention import log_retention_flow
from flows.stages import open_serving_store
from serving.state.store import RequestLogEntry


def test_the_retention_flow_erases_old_log_texts_and_keeps_the_numbers(prefect_harness: None, tmp_path: Path) -> None:
    cfg = load_config(CONFIG_DIR / "tiny.yaml", ["serving.log_text_retention_days=7"])
    home = Home(tmp_path / "home")
    now = datetime.now(UTC)
    row = RequestLogEntry(
        request_id="old",
        at=now - timedelta(days=8),
        key_id="key_a",
        model="chat",
        model_version="chat/1",
        status="ok",
        http_status=200,
        completion_tokens=9,
        prompt_text="an old prompt",
        response_text="an old reply",
        cost_usd=0.5,
    )
    with open_serving_store(cfg, home) as store:
        store.log_answer(row)
        store.log_answer(RequestLogEntry(**{**row.__dict__, "request_id": "new", "at": now - timedelta(days=6)}))

    assert log_retention_flow(cfg, home) == {"retention_days": 7, "request_log_rows": 1, "shadow_log_rows": 0}
    with open_serving_store(cfg, home) as store:
        rows = {r.request_id: r for r in store.request_log()}
        assert (rows["old"].prompt_text, rows["old"].response_text) == (None, None)
        assert (rows["old"].completion_tokens, rows["old"].cost_usd) == (9, 0.5)
        assert rows["new"].prompt_text == "an old prompt"
        assert store.usage("key_a")[0].cost_usd == 0.5  # billing untouched
    assert log_retention_flow(cfg, home)["request_log_rows"] == 0
