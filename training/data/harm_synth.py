"""The harm-intent data of the safety classifier: generated prompts, packaged prompt sets, user JSONL, and its
content-addressed snapshot.

    snap = build_harm_snapshot(cfg, sources=[Path("red_team.jsonl")], root=home.snapshots / "safety")
    snap.records("train")        # {"text", "label", "kind", "wording", "source"} (a chat Snapshot's reader)

A record is one user prompt with its ``label`` (a harm category of ``harm_pools.HARM_CATEGORIES`` or ``benign``)
and its ``kind`` (``harmful``, ``benign_risky``, ``benign``). Generated prompts are a frame with an action put in
(``harm_pools``); every frame, action and statement belongs to one split by its position (``split_of``), so the
validation and test prompts share no wording unit with training (``wording`` names the units: ``f3+weapons.a7``).

Prompt sets written by people come from packages (``training.data.harm_packaged``): a dealt set's prompts go to
the three splits by their position in their file, the eval ones kept only if no training prompt shares their
wording (the rule below, turned around); an external set is held out whole as ``external.jsonl`` (the eval's
``harm_external`` suite), with the same rule against the final training split.

User JSONL (``{"text": ..., "label": ...}``, optional ``"kind"``; feedback and red-team prompts curated by
``lifecycle safety-classifier``) goes to the training split only, after the leakage rule: a user prompt whose
loose text, or any word 6-gram, occurs in a validation or test prompt is dropped and counted (the eval wording
stays apart). The snapshot folder is named by the SHA-256 of every record (splits in order, records sorted by
their hash), like the chat snapshot (``training.data.snapshot``); the same inputs give the same hash anywhere.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from core.errors import DataError
from core.hashing import canonical_json, sha256_file, sha256_text
from training.data.harm_generator import generate_harm, split_of
from training.data.harm_packaged import LoadedSet
from training.data.harm_pools import HARM_CATEGORIES
from training.data.records import Phrasings, loose_text
from training.data.snapshot import SPLITS, Snapshot

LABELS: tuple[str, ...] = (*HARM_CATEGORIES, "benign")
SCHEMA = "harm-v1"
NGRAM = 6  # word n-grams the leakage contract compares
MANIFEST = "manifest.json"
EXTERNAL = "external"  # the file of prompt sets held out whole (external.jsonl): judged, never trained on
CHAT_TRAIN_SKILLS = ("arithmetic", "formatting")  # ordinary benign for training
CHAT_EVAL_SKILLS = ("unit_conversion", "facts")  # ordinary benign for validation and test: other skills' wording


def chat_prompts(per_split: int, seed: int = 1234) -> dict[str, list[dict[str, str]]]:
    """Ordinary benign prompts from the chat generator (``training.data.synth``), up to ``per_split`` per split:
    training gets its arithmetic and formatting prompts, validation and test its conversions and facts, and half
    as many of its ``borderline`` skill (benign requests in risky-sounding frames) each, dealt by text hash. The
    skills differ between training and eval, so their wording does too."""
    from training.config import GeneratorConfig
    from training.data.synth import generate

    out: dict[str, list[dict[str, str]]] = {s: [] for s in SPLITS}
    if per_split <= 0:
        return out
    pools: dict[str, set[str]] = {"train": set(), "eval": set(), "borderline": set()}
    for rec in generate(GeneratorConfig(seed=seed)):
        skill = str(rec["metadata"]["skill"])
        pool = (
            "train"
            if skill in CHAT_TRAIN_SKILLS
            else "eval"
            if skill in CHAT_EVAL_SKILLS
            else "borderline"
            if skill == "borderline"
            else None
        )
        if pool is not None:
            pools[pool].add(next(m["content"] for m in rec["messages"] if m["role"] == "user"))

    def pick(texts: set[str], parity: int | None, n: int, kind: str) -> list[dict[str, str]]:
        chosen = sorted(
            (t for t in texts if parity is None or int(sha256_text(t)[:8], 16) % 2 == parity), key=sha256_text
        )
        return [
            {"text": t, "label": "benign", "kind": kind, "wording": "", "source": "chat-generator"} for t in chosen[:n]
        ]

    out["train"] = pick(pools["train"], None, per_split, "benign")
    for split, parity in (("validation", 0), ("test", 1)):
        out[split] = pick(pools["eval"], parity, per_split, "benign") + pick(
            pools["borderline"], parity, per_split // 2, "benign_risky"
        )
    return out


def ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    words = "".join(c if c.isalnum() or c == "'" else " " for c in loose_text(text)).split()
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def wording_units(record: dict[str, str]) -> set[str]:
    return set(record.get("wording", "").split("+")) - {""}


def check_disjoint(splits: dict[str, list[dict[str, str]]]) -> None:
    """The leakage contract: no wording unit, loose text or word 6-gram of a training prompt in a validation or
    test prompt. Raises ``DataError`` naming the first offender."""
    train = splits["train"]
    units = set().union(*(wording_units(r) for r in train)) if train else set()
    texts = {loose_text(r["text"]) for r in train}
    grams = set().union(*(ngrams(r["text"]) for r in train)) if train else set()
    for split in ("validation", "test"):
        for r in splits[split]:
            shared = wording_units(r) & units
            if shared:
                raise DataError(
                    f"harm snapshot: {split} prompt {r['text']!r} shares wording {sorted(shared)} with train"
                )
            if loose_text(r["text"]) in texts:
                raise DataError(f"harm snapshot: {split} prompt {r['text']!r} is also a training prompt")
            common = ngrams(r["text"]) & grams
            if common:
                raise DataError(
                    f"harm snapshot: {split} prompt {r['text']!r} shares the phrase {' '.join(min(common))!r} "
                    "with a training prompt"
                )


def read_user_records(paths: list[Path]) -> list[dict[str, str]]:
    """User JSONL: one ``{"text", "label"[, "kind"]}`` per line; a bad line is an error naming file and line."""
    out = []
    for path in paths:
        files = sorted(path.rglob("*.jsonl")) if path.is_dir() else [path]
        for file in files:
            for n, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                    text, label = str(obj["text"]).strip(), str(obj["label"])
                except (ValueError, KeyError, TypeError) as exc:
                    raise DataError(f"{file}:{n}: not a harm record ({exc})") from None
                if label not in LABELS or not text:
                    raise DataError(f"{file}:{n}: label must be one of {', '.join(LABELS)} (got {label!r})")
                kind = str(obj.get("kind") or ("harmful" if label != "benign" else "benign"))
                out.append({"text": text, "label": label, "kind": kind, "wording": "", "source": file.name})
    return out


def _record_hash(r: dict[str, str]) -> str:
    return sha256_text(canonical_json(r))


def _dedup(records: list[dict[str, str]]) -> list[dict[str, str]]:
    seen: set[str] = set()
    out = []
    for r in records:
        key = loose_text(r["text"])
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def harm_snapshot_hash(splits: dict[str, list[dict[str, str]]], external: list[dict[str, str]] | None = None) -> str:
    lines = [f"{SCHEMA}"] + [f"{s}\t{_record_hash(r)}" for s in SPLITS for r in splits[s]]
    lines += [f"{EXTERNAL}\t{_record_hash(r)}" for r in external or []]
    return sha256_text("\n".join(lines))


def external_records(snapshot: Snapshot) -> list[dict[str, str]]:
    """The snapshot's external slice (prompt sets held out whole, ``training.data.harm_packaged``); [] if none."""
    path = snapshot.path / f"{EXTERNAL}.jsonl"
    if f"{EXTERNAL}.jsonl" not in snapshot.manifest.get("files", {}) or not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _shares_wording(r: dict[str, str], texts: set[str], grams: set[tuple[str, ...]]) -> bool:
    return loose_text(r["text"]) in texts or bool(ngrams(r["text"]) & grams)


def _generator_source(statements: bool, twins: int, meta: bool = False, discreet: bool = False) -> str:
    extras = ["training-only statements"] * statements + [f"benign twins in {twins} frames"] * bool(twins)
    extras += ["turns about the conversation"] * meta + ["requests for discretion"] * discreet
    return f"generator (with {'; '.join(extras)})" if extras else "generator"  # no ", ": the lineage tag joins with it


def build_harm_snapshot(
    root: Path,
    *,
    generator: bool = True,
    chat_per_split: int = 0,
    sources: list[Path] | None = None,
    dealt_sets: Sequence[LoadedSet] = (),
    external_sets: Sequence[LoadedSet] = (),
    training_sets: Sequence[LoadedSet] = (),
    avoid: Sequence[str] = (),
    statements: bool = False,
    twins: int = 0,
    meta: bool = False,
    discreet: bool = False,
) -> Snapshot:
    """Build (or find) the classifier's snapshot under ``root`` from the generator, the chat generator's benign
    prompts (eval only, ``chat_prompts``), prompt sets from packages (``dealt_sets`` into the splits by position,
    ``external_sets`` held out whole as ``external.jsonl``, ``training_sets`` added to training whole) and user
    JSONL (see the module). No training prompt shares a phrasing with ``avoid`` (the chat eval's hand-written items:
    ``Phrasings``, a run of ``PHRASE_WORDS`` words), so the classifier in front of the model never learnt the
    wording the gate asks in (``evals.as_served``).
    ``statements``: the generator's training-only whole prompts too; ``twins``: its concepts' benign twins, in that
    many frames each; ``meta``: the turns people send about the conversation itself; ``discreet``: lawful requests
    for discretion (``generate_harm``)."""
    splits = generate_harm(statements, twins, meta, discreet) if generator else {s: [] for s in SPLITS}
    dropped = Counter[str]()
    chat = chat_prompts(chat_per_split)
    dealt: dict[str, list[dict[str, str]]] = {s: [] for s in SPLITS}
    external: list[dict[str, str]] = []
    for loaded in dealt_sets:
        for r in loaded.records:
            dealt[split_of(int(r["position"]))].append({k: v for k, v in r.items() if k != "position"})
    for loaded in external_sets:
        external += [{k: v for k, v in r.items() if k != "position"} for r in loaded.records]
    train_grams = set().union(*(ngrams(r["text"]) for r in splits["train"])) if splits["train"] else set()
    train_texts = {loose_text(r["text"]) for r in splits["train"]}
    for split in ("validation", "test"):  # more eval prompts (chat generator, packaged sets): no training wording
        for reason, records in (("chat_prompt", chat[split]), ("packaged_eval_prompt", dealt[split])):
            if not records:
                continue
            kept = [r for r in records if not _shares_wording(r, train_texts, train_grams)]
            dropped[f"{reason}_shares_training_wording"] += len(records) - len(kept)
            splits[split] += kept
    held = set().union(*(ngrams(r["text"]) for s in ("validation", "test") for r in splits[s]))
    held_texts = {loose_text(r["text"]) for s in ("validation", "test") for r in splits[s]}
    # additions to training never share eval wording
    trained = [{k: v for k, v in r.items() if k != "position"} for loaded in training_sets for r in loaded.records]
    for r in chat["train"] + dealt["train"] + trained + read_user_records(sources or []):
        if _shares_wording(r, held_texts, held):
            dropped["overlaps_eval_wording"] += 1
            continue
        splits["train"].append(r)
    if avoid:
        avoided = Phrasings.of(avoid)
        kept = [r for r in splits["train"] if avoided.shared(r["text"]) is None]
        dropped["shares_chat_eval_phrasing"] += len(splits["train"]) - len(kept)
        splits["train"] = kept
    before = len(splits["train"])
    splits = {s: sorted(_dedup(rs), key=_record_hash) for s, rs in splits.items()}
    dropped["duplicate"] += before - len(splits["train"])
    if not splits["train"] or not splits["validation"] or not splits["test"]:
        raise DataError("harm snapshot: every split needs records (enable the generator or add validation data)")
    check_disjoint(splits)
    # the external slice is judged as held-out data too: none of its wording in training
    all_train_grams = set().union(*(ngrams(r["text"]) for r in splits["train"]))
    all_train_texts = {loose_text(r["text"]) for r in splits["train"]}
    unique = _dedup(external)
    kept_external = [r for r in unique if not _shares_wording(r, all_train_texts, all_train_grams)]
    if external:
        dropped["external_prompt_shares_training_wording"] += len(unique) - len(kept_external)
    external = sorted(kept_external, key=_record_hash)
    digest = harm_snapshot_hash(splits, external)
    target = root / digest
    if (target / MANIFEST).is_file():
        return Snapshot(digest, target, json.loads((target / MANIFEST).read_text(encoding="utf-8")))
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".harm-", dir=root))
    try:
        files = {**splits, EXTERNAL: external} if external else splits
        for split, records in files.items():
            (tmp / f"{split}.jsonl").write_text("".join(canonical_json(r) + "\n" for r in records), encoding="utf-8")
        manifest = {
            "hash": digest,
            "schema": SCHEMA,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "sources": [_generator_source(statements, twins, meta, discreet)] * generator
            + [f"{p.provenance['package']}:{p.provenance['set']}" for p in dealt_sets]
            + [f"{p.provenance['package']}:{p.provenance['set']} (external)" for p in external_sets]
            + [f"{p.provenance['package']}:{p.provenance['set']} (training)" for p in training_sets]
            + [str(p) for p in sources or []],
            "packaged": [{**p.provenance, "role": "dealt"} for p in dealt_sets]
            + [{**p.provenance, "role": "external"} for p in external_sets]
            + [{**p.provenance, "role": "training"} for p in training_sets],
            "counts": {s: len(rs) for s, rs in files.items()},
            "labels": {s: dict(sorted(Counter(r["label"] for r in rs).items())) for s, rs in files.items()},
            "kinds": {s: dict(sorted(Counter(r["kind"] for r in rs).items())) for s, rs in files.items()},
            "by_source": {s: dict(sorted(Counter(r["source"] for r in rs).items())) for s, rs in files.items()},
            "dropped": dict(dropped),
            "files": {f"{s}.jsonl": sha256_file(tmp / f"{s}.jsonl") for s in files},
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        try:
            os.rename(tmp, target)
        except OSError:  # built concurrently by someone else: theirs is the same bytes
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Snapshot(digest, target, json.loads((target / MANIFEST).read_text(encoding="utf-8")))
