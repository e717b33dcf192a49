"""The curated-record store: content-named record files (the same records give the same file), withdrawal of
records whose conversation may no longer be used, the export state, and what a snapshot has not trained on yet."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from core.hashing import sha256_file
from training.data.curate import prompt_keys
from training.data.curated import CuratedStore
from training.data.snapshot import Snapshot


def record(conversation: str, prompt: str) -> str:
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": "Sure."}]
    return json.dumps({"messages": messages, "metadata": {"source": "curated", "conversation": conversation}})


def jsonl(*records: str) -> str:
    return "".join(r + "\n" for r in records)


def snapshot_with(path: Path, sources: list[Path]) -> Snapshot:
    manifest = {"sources": [{"path": str(p), "sha256": sha256_file(p)} for p in sources]}
    return Snapshot(hash="0" * 64, path=path, manifest=manifest)


def test_records_are_named_by_content_and_found_again(tmp_path: Path) -> None:
    store = CuratedStore(tmp_path / "curated")
    assert store.sources() == [] and store.last_until() is None
    text = jsonl(record("c1", "What is 2+2?"), record("c2", "Name a colour."))
    first = store.write(text)
    assert store.write(text) == first and store.sources() == [first]
    assert first.parent == store.records and first.read_text(encoding="utf-8") == text
    assert store.prompt_keys() == prompt_keys(json.loads(line) for line in text.splitlines())


def test_withdraw_keeps_only_allowed_conversations(tmp_path: Path) -> None:
    store = CuratedStore(tmp_path / "curated")
    mixed = store.write(jsonl(record("c1", "a"), record("c2", "b")))
    gone = store.write(jsonl(record("c3", "c")))
    assert store.withdraw({"c1", "c2", "c3"}) == 0 and set(store.sources()) == {mixed, gone}
    assert store.withdraw({"c1"}) == 2
    (left,) = store.sources()
    assert not mixed.exists() and not gone.exists()
    assert [json.loads(line)["metadata"]["conversation"] for line in left.read_text().splitlines()] == ["c1"]


def test_export_state_round_trips(tmp_path: Path) -> None:
    store = CuratedStore(tmp_path / "curated")
    until = datetime(2025, 3, 1, 12, 30, tzinfo=UTC)
    store.save_until(until)
    assert CuratedStore(tmp_path / "curated").last_until() == until


def test_untrained_counts_records_in_files_the_snapshot_lacks(tmp_path: Path) -> None:
    store = CuratedStore(tmp_path / "curated")
    trained = store.write(jsonl(record("c1", "a"), record("c2", "b")))
    assert store.untrained(snapshot_with(tmp_path, [trained])) == 0
    store.write(jsonl(record("c3", "c"), record("c4", "d"), record("c5", "e")))
    assert store.untrained(snapshot_with(tmp_path, [trained])) == 3
    assert store.untrained(snapshot_with(tmp_path, [])) == 5
    # a snapshot the self-replies stage derived names its source snapshot, not files: followed to them
    source = snapshot_with(tmp_path / ("0" * 64), [trained])
    source.path.mkdir(parents=True)
    (source.path / "manifest.json").write_text(json.dumps({"hash": source.hash, **source.manifest}))
    derived = Snapshot(hash="1" * 64, path=tmp_path / ("1" * 64), manifest={"sources": [{"snapshot": source.hash}]})
    assert store.untrained(derived) == 3


def pair(chosen: str) -> str:
    messages = [{"role": "user", "content": "What is 2+2?"}]
    return json.dumps({"messages": messages, "chosen": chosen, "rejected": "5", "metadata": {"source": "feedback"}})


def test_preferences_are_one_content_named_file_replaced_by_each_export(tmp_path: Path) -> None:
    store = CuratedStore(tmp_path / "curated")
    assert store.preference_sources() == []
    first = store.replace_preferences(jsonl(pair("4"), pair("four")))
    assert (first.added, first.withdrawn) == (2, 0)
    assert first.path is not None and first.path.parent == store.preferences
    assert store.preference_sources() == [first.path]
    same = store.replace_preferences(jsonl(pair("4"), pair("four")))
    assert (same.path, same.added, same.withdrawn) == (first.path, 0, 0)
    fewer = store.replace_preferences(jsonl(pair("4"), pair("Four.")))  # one withdrawn, one new
    assert (fewer.added, fewer.withdrawn) == (1, 1) and store.preference_sources() == [fewer.path]
    assert fewer.path is not None and fewer.path.read_text(encoding="utf-8") == jsonl(pair("4"), pair("Four."))
    none = store.replace_preferences("")
    assert (none.path, none.added, none.withdrawn) == (None, 0, 2) and store.preference_sources() == []
    assert store.sources() == []  # pairs are no chat-record source of the SFT snapshot
