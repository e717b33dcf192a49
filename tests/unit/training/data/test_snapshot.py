from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support.helpers import chat, write_jsonl

from core.errors import DataError, InvalidRecordsError, NotFoundError
from training.config import SnapshotConfig
from training.data.records import parse_record
from training.data.snapshot import (
    SPLITS,
    Snapshot,
    assign_split,
    build_snapshot,
    check_leakage,
    list_snapshots,
    load_snapshot,
)

CFG = SnapshotConfig(validation_fraction=0.2, test_fraction=0.2)


def rows(n: int = 40) -> list[dict[str, object]]:
    return [chat(f"What is {i} + {i}?", f"The answer is {2 * i}.", skill="arithmetic") for i in range(n)]


def build(tmp: Path, sources: list[Path], cfg: SnapshotConfig = CFG) -> Snapshot:
    return build_snapshot(cfg, sources, tmp / "snapshots", reports=tmp / "reports")


def test_same_records_same_hash_whatever_the_files_order_or_machine(tmp_path: Path) -> None:
    data = rows()
    one = write_jsonl(tmp_path / "a" / "all.jsonl", data)
    half1 = write_jsonl(tmp_path / "b" / "z-part.jsonl", data[20:][::-1])
    half2 = write_jsonl(tmp_path / "b" / "a-part.jsonl", data[:20])
    first = build(tmp_path / "home1", [one])
    second = build(tmp_path / "home2", [tmp_path / "b"])  # a folder, split differently, other order
    assert first.hash == second.hash
    assert first.manifest["counts"] == second.manifest["counts"]
    assert half1.exists() and half2.exists()
    assert sum(first.manifest["counts"].values()) == 40
    assert all(first.manifest["counts"][s] > 0 for s in SPLITS)


def test_one_changed_character_changes_the_hash(tmp_path: Path) -> None:
    data = rows()
    a = build(tmp_path, [write_jsonl(tmp_path / "a.jsonl", data)])
    data[7] = chat("What is 7 + 7?", "The answer is 14!", skill="arithmetic")
    b = build(tmp_path, [write_jsonl(tmp_path / "b.jsonl", data)])
    assert a.hash != b.hash
    assert len(list_snapshots(tmp_path / "snapshots")) == 2


def test_rebuilding_is_a_no_op_that_returns_the_same_snapshot(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "a.jsonl", rows())
    a = build(tmp_path, [src])
    stamps = {p.name: p.stat().st_mtime_ns for p in a.path.iterdir()}
    b = build(tmp_path, [src])
    assert b.hash == a.hash and b.manifest["created_at"] == a.manifest["created_at"]
    assert {p.name: p.stat().st_mtime_ns for p in b.path.iterdir()} == stamps
    assert [p.name for p in (tmp_path / "snapshots").iterdir()] == [a.hash]  # no temp folders left behind


def test_snapshot_is_immutable_and_verifiable(tmp_path: Path) -> None:
    snap = build(tmp_path, [write_jsonl(tmp_path / "a.jsonl", rows())])
    for path in snap.path.iterdir():
        assert not os.access(path, os.W_OK) or os.geteuid() == 0
        assert oct(path.stat().st_mode & 0o222) == "0o0"
    snap.verify()
    train = snap.split_path("train")
    train.chmod(0o644)
    train.write_text(train.read_text().replace("answer", "ANSWER"))
    with pytest.raises(DataError, match="does not match its manifest"):
        snap.verify()


def test_manifest_contents(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "a.jsonl", rows())
    snap = build_snapshot(CFG, [src], tmp_path / "s", reports=tmp_path / "r", provenance={"generator": {"seed": 5}})
    m = snap.manifest
    assert m["hash"] == snap.hash and m["schema_version"] == 1
    assert m["sources"][0]["records"] == 40 and len(m["sources"][0]["sha256"]) == 64
    assert m["provenance"] == {"generator": {"seed": 5}}
    assert (
        set(m["files"])
        == {
            "train.jsonl",
            "validation.jsonl",
            "test.jsonl",
        }
        and "created_at" in m
    )
    assert sum(m["skills"]["train"].values()) == m["counts"]["train"]
    stored = [json.loads(line) for s in SPLITS for line in snap.split_path(s).read_text().splitlines()]
    assert len(stored) == 40


def test_bad_records_fail_the_build_with_a_report_and_write_nothing(tmp_path: Path) -> None:
    data: list[object] = rows(10)
    data.insert(2, "{not json")
    data.insert(5, {"messages": [{"role": "user", "content": "hi"}]})
    data.insert(7, chat("What is 1 + 1?", "The answer is 2.", skill="arithmetic"))  # exact duplicate of row 1
    data.insert(8, chat("what is 1  +  1?", "The answer is 2.", skill="arithmetic"))  # normalized duplicate
    src = write_jsonl(tmp_path / "bad.jsonl", data)
    with pytest.raises(InvalidRecordsError) as err:
        build(tmp_path, [src])
    problems = {(p.line, p.code) for p in err.value.problems}
    assert problems == {(3, "invalid_json"), (6, "role_order"), (8, "duplicate"), (9, "near_duplicate")}
    assert f"{src}:3: not valid JSON" in str(err.value)
    assert not (tmp_path / "snapshots").exists()
    report = [json.loads(line) for line in Path(err.value.report_path or "").read_text().splitlines()]
    assert {(r["line"], r["code"]) for r in report} == problems
    assert report[0]["source"] == str(src)


def test_drop_mode_drops_and_counts_never_silently(tmp_path: Path) -> None:
    data: list[object] = [*rows(10), "[1, 2", chat("What is 1 + 1?", "The answer is 2.", skill="arithmetic")]
    snap = build(tmp_path, [write_jsonl(tmp_path / "a.jsonl", data)], CFG.model_copy(update={"on_invalid": "drop"}))
    assert sum(snap.manifest["counts"].values()) == 10
    assert snap.manifest["rejected"]["total"] == 2
    assert snap.manifest["rejected"]["by_reason"] == {"duplicate": 1, "invalid_json": 1}
    assert Path(snap.manifest["rejected"]["report"]).is_file()


def test_same_prompt_never_spans_splits(tmp_path: Path) -> None:
    data = [chat(f"Question {i}", f"answer {j}") for i in range(60) for j in range(3)]
    snap = build(tmp_path, [write_jsonl(tmp_path / "a.jsonl", data)])
    owner: dict[str, str] = {}
    for split in SPLITS:
        for record in snap.records(split):
            prompt = record["messages"][0]["content"]
            assert owner.setdefault(prompt, split) == split
    assert len(set(owner.values())) == 3


def test_check_leakage_detects_a_prompt_in_two_splits() -> None:
    a = parse_record(chat("Same prompt", "one"), CFG)
    b = parse_record(chat("same   PROMPT", "two"), CFG)
    with pytest.raises(DataError, match="in both train and test"):
        check_leakage({"train": [a], "validation": [], "test": [b]})


def test_split_assignment_follows_the_fractions() -> None:
    cfg = SnapshotConfig(validation_fraction=0.1, test_fraction=0.2)
    splits = [assign_split(f"key-{i}", cfg) for i in range(5000)]
    assert abs(splits.count("test") / 5000 - 0.2) < 0.03
    assert abs(splits.count("validation") / 5000 - 0.1) < 0.03


def test_missing_and_empty_sources(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="source not found"):
        build(tmp_path, [tmp_path / "nope.jsonl"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="has no .jsonl files"):
        build(tmp_path, [tmp_path / "empty"])
    with pytest.raises(DataError, match="no valid records"):
        build(tmp_path, [write_jsonl(tmp_path / "blank.jsonl", ["", "  "])])


def test_non_utf8_source_is_a_clear_error(tmp_path: Path) -> None:
    src = tmp_path / "latin1.jsonl"
    src.write_bytes(b'{"messages": "caf\xe9"}\n')
    with pytest.raises(DataError, match="is not UTF-8"):
        build(tmp_path, [src])


def test_load_by_prefix(tmp_path: Path) -> None:
    snap = build(tmp_path, [write_jsonl(tmp_path / "a.jsonl", rows())])
    assert load_snapshot(tmp_path / "snapshots", snap.hash[:8]).hash == snap.hash
    with pytest.raises(NotFoundError, match="too short"):
        load_snapshot(tmp_path / "snapshots", "ab")
    with pytest.raises(NotFoundError, match="no snapshot"):
        load_snapshot(tmp_path / "snapshots", "ffffffffff")
