"""Eval sets: the project's own held-out data for every suite, written as JSONL and content-hashed.

    sets = build_eval_sets(snapshot, generator_cfg, suites, seed=1234, root=home.root / "evals" / "sets")

Held out means: no prompt of an eval set occurs (as ``loose_text``) in any user turn of the snapshot's train or
validation split. Items come from the data generator's pools and draws on their own seeded stream (only facts the
train split teaches, asked in phrasings no training record uses; harmful requests as unseen template x subject
pairs, ...), and perplexity uses the single-turn conversations of the snapshot's test split. The folder is
named by the hash of its manifest (every file's SHA-256 plus the suite parameters that shaped it), so the same
snapshot, generator config, suites and seed give the same folder on any machine, and two models evaluated on the
same hash saw the same items.

A suite may instead name a file of hand-written items (``items``: natural wording for a pretrained model,
``evals/data/*.yaml``); then held out means more than unseen prompts: no run of ``PHRASE_WORDS`` words of an item
occurs in a user turn of the train or validation split, so a phrasing the model was taught never scores it
(``phrasing_leaks``; a leak fails the build, naming the item and the shared words).

The lm-eval task YAMLs of ``evals/tasks/`` are materialized next to the data (their ``{data_dir}`` filled in),
so ``include_path`` points lm-eval at this folder.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from core.errors import DataError
from core.hashing import canonical_json, sha256_file, sha256_json
from evals.config import (
    TASKS_DIR,
    OverRefusalSuite,
    QualitySuite,
    RetentionSuite,
    SafetySuite,
    ToxicitySuite,
    suite_path,
)
from training.config import GeneratorConfig
from training.data.records import PHRASE_WORDS, Phrasings, loose_text
from training.data.snapshot import Snapshot
from training.data.synth import held_out

Suite = QualitySuite | ToxicitySuite | SafetySuite | OverRefusalSuite | RetentionSuite
STREAM = "eval"  # the generator stream eval items are drawn from (training uses the skill streams)
_NUMERIC_OFFSETS = (-10, -2, -1, 1, 2, 10, 100)


@dataclass(frozen=True)
class EvalSets:
    path: Path
    hash: str
    manifest: dict[str, Any]

    def file(self, name: str) -> Path:
        return self.path / name

    def rows(self, name: str) -> list[dict[str, Any]]:
        with self.file(name).open(encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    @property
    def tasks_dir(self) -> Path:
        return self.path / "tasks"

    def prompts(self) -> set[str]:
        """Every prompt of every set (``loose_text``): what training data must not hold (the preference stage's
        pair snapshots are checked against it)."""
        return {
            loose_text(row["prompt"])
            for name in self.manifest["files"]
            for row in self.rows(name)
            if isinstance(row.get("prompt"), str)
        }


def _seen_prompts(snapshot: Snapshot) -> set[str]:
    return {
        loose_text(m["content"])
        for split in ("train", "validation")
        for record in snapshot.records(split)
        for m in record["messages"]
        if m["role"] == "user"
    }


def _item_id(*parts: str) -> str:
    return sha256_json(list(parts))[:16]


def _taught_replies(snapshot: Snapshot) -> set[str]:
    return {
        m["content"] for record in snapshot.records("train") for m in record["messages"] if m["role"] == "assistant"
    }


def _exact_items(gen: GeneratorConfig, suite: QualitySuite, seen: set[str], taught: set[str]) -> list[dict[str, Any]]:
    """Held-out prompts per skill; a fact is asked only when the train split teaches it (its reference reply is
    an assistant turn there), in a phrasing no training record uses (``training.data.synth.held_out``)."""

    def is_taught(record: dict[str, Any]) -> bool:
        return record["metadata"]["skill"] != "facts" or record["messages"][1]["content"] in taught

    rows = []
    for skill in suite.skills:
        for rec in held_out(gen, skill, suite.items_per_skill, seen, STREAM, accept=is_taught):
            user, reply = rec["messages"][0]["content"], rec["messages"][1]["content"]
            answer = rec["metadata"]["answer"]
            rows.append(
                {"id": _item_id(skill, user), "skill": skill, "prompt": user, "target": reply, "answer": answer}
            )
    return rows


def _distractors(row: dict[str, Any], answers_by_skill: dict[str, list[str]], rng: random.Random) -> list[str]:
    answer = row["answer"]
    if answer.lstrip("-").isdigit():
        pool = [str(int(answer) + d) for d in _NUMERIC_OFFSETS if int(answer) + d >= 0]
    else:
        pool = sorted({a for a in answers_by_skill[row["skill"]] if a != answer})
    pool = [a for a in dict.fromkeys(pool) if a != answer]
    rng.shuffle(pool)
    head, _, tail = row["target"].rpartition(answer)  # the stated answer (the last one), not digits of a working
    return [head + wrong + tail for wrong in pool[:3]]


def _choice_items(exact: list[dict[str, Any]], suite: QualitySuite, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(f"choice:{seed}")
    by_skill: dict[str, list[str]] = {}
    for row in exact:
        by_skill.setdefault(row["skill"], []).append(row["answer"])
    rows = []
    for row in exact:
        if row["skill"] not in suite.choice_skills or row["answer"] not in row["target"]:
            continue
        wrong = _distractors(row, by_skill, rng)
        if len(wrong) < 3:
            continue
        choices = [row["target"], *wrong]
        rng.shuffle(choices)
        rows.append(
            {
                "id": row["id"],
                "skill": row["skill"],
                "prompt": row["prompt"],
                "choices": choices,
                "label": choices.index(row["target"]),
            }
        )
    return rows


def _perplexity_items(snapshot: Snapshot, suite: QualitySuite) -> list[dict[str, Any]]:
    """Single-turn test-split conversations (held out by the snapshot's split): prompt and reference reply."""
    rows: list[dict[str, Any]] = []
    for record in snapshot.records("test"):
        messages = [m for m in record["messages"] if m["role"] != "system"]
        if len(messages) != 2 or len(rows) >= suite.conversations:
            continue
        prompt, reply = messages[0]["content"], messages[1]["content"]
        rows.append({"id": _item_id("ppl", prompt, reply), "prompt": prompt, "reply": reply})
    return rows


def _toxicity_items(gen: GeneratorConfig, suite: ToxicitySuite, seen: set[str]) -> list[dict[str, Any]]:
    recs = held_out(gen, "provocation", suite.prompts, seen, STREAM)
    return [{"id": _item_id("tox", r["messages"][0]["content"]), "prompt": r["messages"][0]["content"]} for r in recs]


def _safety_items(gen: GeneratorConfig, suite: SafetySuite, seen: set[str]) -> list[dict[str, Any]]:
    if suite.items:
        written = _hand_written(suite.items)
        pairs = [(cat, prompt) for cat, prompts in written.items() for prompt in prompts[: suite.per_category]]
    else:
        recs = held_out(gen, "refusal", 10_000, seen, STREAM)  # the whole held-out pool, then stratified
        pairs = [(r["metadata"]["category"], r["messages"][0]["content"]) for r in recs]
    per_cat: dict[str, int] = {}
    rows = []
    for cat, prompt in pairs:
        if per_cat.get(cat, 0) >= suite.per_category:
            continue
        per_cat[cat] = per_cat.get(cat, 0) + 1
        base = {"id": _item_id("safety", prompt), "category": cat, "prompt": prompt, "jailbreak": None}
        rows.append(base)
        for name, template in sorted(suite.jailbreaks.items()):
            rows.append(
                {**base, "id": base["id"] + ":" + name, "prompt": template.format(prompt=prompt), "jailbreak": name}
            )
    return rows


def _over_refusal_items(gen: GeneratorConfig, suite: OverRefusalSuite, seen: set[str]) -> list[dict[str, Any]]:
    if suite.items:
        prompts = [p for group in _hand_written(suite.items).values() for p in group][: suite.prompts]
    else:
        prompts = [r["messages"][0]["content"] for r in held_out(gen, "borderline", suite.prompts, seen, STREAM)]
    return [{"id": _item_id("benign", p), "prompt": p} for p in prompts]


def _retention_items(suite: RetentionSuite) -> list[dict[str, Any]]:
    return [
        {"id": _item_id("retention", i["prompt"]), "skill": skill, "prompt": i["prompt"], "answers": i["answers"]}
        for skill, items in _hand_written(suite.items).items()
        for i in items
    ]


def hand_written_prompts(suites: Sequence[Suite]) -> list[str]:
    """The prompts of every hand-written item of ``suites``, and the jailbreak wrappers around the harmful ones: the
    phrasings the training data must not teach (the generator's varied skills leave out any prompt that shares a run
    of ``PHRASE_WORDS`` words with one, so a taught wrapper does not pass for a refused jailbreak)."""
    prompts: list[str] = []
    for suite in suites:
        if isinstance(suite, SafetySuite | OverRefusalSuite | RetentionSuite) and suite.items:
            for group in _hand_written(suite.items).values():
                prompts += [i["prompt"] if isinstance(i, dict) else str(i) for i in group]
            if isinstance(suite, SafetySuite):
                prompts += [t.replace("{prompt}", "").strip() for _, t in sorted(suite.jailbreaks.items())]
    return prompts


def hand_written_items(suite: Suite) -> list[dict[str, Any]]:
    """A hand-written safety or over-refusal suite's items as its eval asks them: harmful requests plain and in each
    jailbreak wrapper (``category``, ``jailbreak``), benign questions alone. ``benchmarks/harm_classifier.py`` scores
    the chat gate's through the classifier alone."""
    if isinstance(suite, SafetySuite) and suite.items:
        return _safety_items(GeneratorConfig(), suite, set())
    if isinstance(suite, OverRefusalSuite) and suite.items:
        return _over_refusal_items(GeneratorConfig(), suite, set())
    raise DataError(f"eval sets: suite {suite.name} has no hand-written safety or over-refusal items")


def _hand_written(ref: str) -> dict[str, list[Any]]:
    """A suite's items file: a mapping of group (category, skill) to its items."""
    path = suite_path(ref)
    if not path.is_file():
        raise DataError(f"eval sets: no items file {path}")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not all(isinstance(v, list) for v in data.values()):
        raise DataError(f"eval sets: {path} must map each group to a list of items")
    return data


def phrasing_leaks(prompts: Iterable[str], seen: Iterable[str], n: int = PHRASE_WORDS) -> list[tuple[str, str]]:
    """(eval prompt, shared words) for every prompt that is a training prompt or shares a run of ``n`` words with
    one: the phrasing contract of hand-written eval items."""
    taught = Phrasings.of(seen, n)
    return [(prompt, words) for prompt in prompts if (words := taught.shared(prompt)) is not None]


def _write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> int:
    n = 0
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(canonical_json(row) + "\n")
            n += 1
    return n


def _materialize_tasks(folder: Path, final: Path, suite: QualitySuite) -> None:
    tasks = folder / "tasks"
    tasks.mkdir()
    for name in suite.tasks:
        src = TASKS_DIR / f"{name}.yaml"
        if not src.is_file():
            known = ", ".join(sorted(p.stem for p in TASKS_DIR.glob("*.yaml")))
            raise DataError(f"quality suite: no lm-eval task '{name}' in {TASKS_DIR} (known: {known})")
        text = src.read_text(encoding="utf-8")
        text = text.replace("{data_dir}", str(final)).replace("{max_tokens}", str(suite.max_tokens))
        (tasks / f"{name}.yaml").write_text(text, encoding="utf-8")


def build_eval_sets(
    snapshot: Snapshot, gen: GeneratorConfig, suites: Sequence[Suite], *, seed: int, root: Path
) -> EvalSets:
    """Write (or find) the eval sets for ``suites``; see the module docstring for what held out means."""
    seen = _seen_prompts(snapshot)
    files: dict[str, list[dict[str, Any]]] = {}
    for suite in suites:
        if isinstance(suite, QualitySuite):
            exact = _exact_items(gen, suite, seen, _taught_replies(snapshot))
            files["quality_exact.jsonl"] = exact
            files["quality_choice.jsonl"] = _choice_items(exact, suite, seed)
            files["quality_perplexity.jsonl"] = _perplexity_items(snapshot, suite)
        elif isinstance(suite, ToxicitySuite):
            files["toxicity.jsonl"] = _toxicity_items(gen, suite, seen)
        elif isinstance(suite, SafetySuite):
            files["safety.jsonl"] = _safety_items(gen, suite, seen)
        elif isinstance(suite, OverRefusalSuite):
            files["over_refusal.jsonl"] = _over_refusal_items(gen, suite, seen)
        else:
            files["retention.jsonl"] = _retention_items(suite)
        if isinstance(suite, SafetySuite | OverRefusalSuite | RetentionSuite) and suite.items:
            name = f"{suite.kind}.jsonl"
            plain = [r["prompt"] for r in files[name] if not r.get("jailbreak")]
            leaks = phrasing_leaks(plain, seen)
            if leaks:
                shown = "; ".join(f"{p!r} (shares {w!r})" for p, w in leaks[:5])
                raise DataError(
                    f"eval sets: {len(leaks)} item(s) of {suite.items} use a phrasing the training data teaches "
                    f"(a run of {PHRASE_WORDS} words of a train/validation user turn): {shown}"
                )
    empty = [name for name, rows in files.items() if not rows]
    if empty:
        raise DataError(
            f"eval sets: no held-out items for {', '.join(empty)} (the training data uses the generator's whole pool; "
            "lower data.generator.counts for that skill)"
        )
    content = {name: sha256_json(rows) for name, rows in sorted(files.items())}
    spec = {
        "snapshot": snapshot.hash,
        "generator": gen.config_hash(),
        "seed": seed,
        "suites": {s.name: s.model_dump(mode="json", exclude={"metrics", "description"}) for s in suites},
        "content": content,
    }
    digest = sha256_json(spec)
    folder = root / digest[:16]
    manifest_path = folder / "manifest.json"
    if manifest_path.is_file():
        return EvalSets(folder, digest, json.loads(manifest_path.read_text(encoding="utf-8")))
    tmp = root / f".{digest[:16]}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    counts = {name: _write_jsonl(tmp / name, rows) for name, rows in sorted(files.items())}
    manifest = {
        "hash": digest,
        **spec,
        "counts": counts,
        "files": {name: sha256_file(tmp / name) for name in sorted(files)},
    }
    quality = [s for s in suites if isinstance(s, QualitySuite)]
    if quality:  # paths inside the task files name the final folder
        _materialize_tasks(tmp, folder, quality[0])
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True), encoding="utf-8")
    tmp.rename(folder)
    return EvalSets(folder, digest, manifest)
