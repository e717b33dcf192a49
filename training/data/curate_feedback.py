"""Curation of production feedback into preference pairs: ``curate_feedback(rated, ...) -> PreferenceCuration``.

The feedback half of ``training.data.curate`` (same consent, safety, held-out and scrubbing rules, the same
``SafetyChecker`` Protocol and scrubber; read its docstring): rated answers come in as plain records
(``SourceFeedback``, read from the serving store by ``flows/curation.py``) and preference records come out, one
JSON object a line::

    {"messages": [...prompt: optional system, alternating user/assistant, ending with a user turn...],
     "chosen": "...", "rejected": "...", "metadata": {"source": "feedback", ...scalars}}

Rules, in the order they apply to each rated answer (each gets exactly one outcome, ``rated`` is their sum):

1. **Consent at export time** (``not_opted_in``, ``deleted``): the key active and opted in now, the answer's
   conversation (if any) neither deleted nor purged.
2. **A completed answer** (``not_completed``): request-log status ok. A refusal or stop text the gateway wrote
   itself (content_filter) is not the model's answer: a pair with it would teach the model nothing it wrote.
3. **A known prompt** (``no_context``): the context the model answered, rebuilt by the store from the stored
   conversation or, for a stateless request, from its single logged user turn.
4. **Safety** (``unsafe``): the prompt must pass the pre-filter and the *chosen side* the post-filter (a better
   answer a user typed, or an answer rated up): training never pulls the model towards blocked text. The rejected
   side is not filtered: a bad answer is exactly what a pair pushes away from (``unsafe_rules``:
   ``prompt:<rule>``, ``chosen:<rule>``).
5. **Contracts** (``invalid`` by reason): prompt plus either answer passes ``training.data.records.parse_record``
   under the snapshot's limits, and chosen differs from rejected after its normalization (``same_answer``).
6. **Held out** (``held_out``): no user turn equal (``loose_text``) to an eval-set prompt.
7. **Pairing.** A thumbs down with a better answer is a pair: chosen = the better answer, rejected = the model's
   answer (``better_answer``). A thumbs down without one is paired with an answer rated up for the same prompt
   (``ChatRecord.prompt_key``: the same context), the earliest rated one that differs (``rated``). Answers left
   without a partner (a thumbs up nobody contradicted, a thumbs down alone) are ``unpaired``; the others ``used``.
8. **PII scrubbed** (``core.redact``) in every text, ``scrubbed`` marked; **deduplicated** by (prompt, chosen,
   rejected) dedup keys, the earliest rating winning (``duplicate`` counts pairs, not answers).

The result is the whole set for the feedback on record: ``flows/curation.py`` recomputes it on every export and
replaces the previous file, so feedback whose key opted out or whose conversation was deleted leaves the data on
the next export (withdrawn). Metadata names answers and keys by provenance hashes only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from core.hashing import canonical_json
from core.redact import redact
from core.refusal import is_refusal
from training.config import SnapshotConfig
from training.data.curate import COMPLETED, SafetyChecker, Scrubber, counts_json, provenance_id
from training.data.records import ChatRecord, Message, RecordInvalid, loose_text, parse_record

SOURCE = "feedback"
UP, DOWN = 1, -1


@dataclass(frozen=True)
class SourceFeedback:
    """One rated answer with the consent facts of its key as they stand at export time (``prompt``, ``reply`` and
    ``better_answer`` are only filled for answers that may be used)."""

    response_id: str
    key_id: str
    model_version: str | None
    status: str
    rating: int
    at: datetime
    opted_in: bool
    deleted: bool
    prompt: tuple[Message, ...] | None = None
    reply: str = ""
    better_answer: str | None = None


@dataclass(frozen=True)
class PreferenceReport:
    """What feedback curation read and why each rated answer was used or not (see the module docstring)."""

    rated: int = 0
    not_opted_in: int = 0
    deleted: int = 0
    not_completed: int = 0
    no_context: int = 0
    unsafe: int = 0
    invalid: int = 0
    held_out: int = 0
    used: int = 0
    unpaired: int = 0
    pairs: int = 0
    better_answer_pairs: int = 0
    rated_pairs: int = 0
    duplicate: int = 0
    scrubbed: int = 0
    unsafe_rules: dict[str, int] = field(default_factory=dict)
    invalid_reasons: dict[str, int] = field(default_factory=dict)
    redactions: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return counts_json(self)


@dataclass(frozen=True)
class PreferenceCuration:
    records: tuple[dict[str, Any], ...]
    report: PreferenceReport

    def jsonl(self) -> str:
        """One canonical JSON object a line (the same feedback gives the same bytes)."""
        return "".join(canonical_json(r) + "\n" for r in self.records)


@dataclass(frozen=True)
class _Answer:
    """A rated answer that passed rules 1-6: its prompt and texts as records hold them (normalized, scrubbed)."""

    src: SourceFeedback
    prompt: tuple[Message, ...]
    prompt_key: str
    reply: str
    better: str | None
    scrubbed: bool
    redactions: Counter[str]


def _scrub(text: str, scrub: Scrubber) -> tuple[str, Counter[str]]:
    clean, counts = scrub(text)
    return clean, Counter({k: v for k, v in counts.items() if v})


def _normalized(prompt: Sequence[Message], answer: str, limits: SnapshotConfig) -> ChatRecord:
    obj = {"messages": [{"role": m.role, "content": m.content} for m in (*prompt, Message("assistant", answer))]}
    return parse_record(obj, limits)


def _outcome(fb: SourceFeedback) -> str | None:
    """Rules 1-3: why the answer cannot be used at all, or None."""
    if not fb.opted_in:
        return "not_opted_in"
    if fb.deleted:
        return "deleted"
    if fb.status != COMPLETED:
        return "not_completed"
    return "no_context" if fb.prompt is None else None


def _answer(
    fb: SourceFeedback,
    checker: SafetyChecker,
    limits: SnapshotConfig,
    held_out: Collection[str],
    scrub: Scrubber,
    counts: Counter[str],
) -> _Answer | None:
    """Rules 1-6 (and scrubbing) for one rated answer; None (its outcome counted) when it is not usable."""
    if (outcome := _outcome(fb)) is not None:
        counts[outcome] += 1
        return None
    assert fb.prompt is not None
    chosen_side = fb.better_answer if fb.rating == DOWN else fb.reply
    rule = checker.check_prompt(fb.prompt)
    rule = f"prompt:{rule}" if rule else None
    if rule is None and chosen_side:
        rule = f"chosen:{reason}" if (reason := checker.check_reply(chosen_side)) else None
    if rule is not None:
        counts["unsafe"] += 1
        counts[f"rule:{rule}"] += 1
        return None
    redactions: Counter[str] = Counter()
    prompt = []
    for m in fb.prompt:
        clean, n = _scrub(m.content, scrub)
        prompt.append(Message(m.role, clean))
        redactions += n
    reply, n = _scrub(fb.reply, scrub)
    redactions += n
    better = None
    if fb.better_answer is not None:
        better, n = _scrub(fb.better_answer, scrub)
        redactions += n
    try:
        record = _normalized(prompt, reply, limits)
        if better is not None:
            better = _normalized(prompt, better, limits).completion
            if loose_text(better) == loose_text(record.completion):
                raise RecordInvalid("same_answer", "the better answer is the model's answer")
    except RecordInvalid as exc:
        counts["invalid"] += 1
        counts[f"reason:{exc.code}"] += 1
        return None
    if any(m.role == "user" and loose_text(m.content) in held_out for m in record.prompt):
        counts["held_out"] += 1
        return None
    scrubbed = bool(redactions)
    return _Answer(fb, record.prompt, record.prompt_key, record.completion, better, scrubbed, redactions)


def _pair(kind: str, rejected: _Answer, chosen_text: str, chosen: _Answer | None) -> dict[str, Any]:
    return {
        "messages": [{"role": m.role, "content": m.content} for m in rejected.prompt],
        "chosen": chosen_text,
        "rejected": rejected.reply,
        "metadata": {
            "source": SOURCE,
            "pairing": kind,
            "key": provenance_id("key", rejected.src.key_id),
            "rejected_response": provenance_id("response", rejected.src.response_id),
            "chosen_response": provenance_id("response", chosen.src.response_id) if chosen else None,
            "model_version": rejected.src.model_version,
            "scrubbed": rejected.scrubbed or (chosen is not None and chosen.scrubbed),
            "rejected_refusal": is_refusal(rejected.reply),
            "chosen_refusal": is_refusal(chosen_text),
        },
    }


def curate_feedback(
    rated: Iterable[SourceFeedback],
    *,
    checker: SafetyChecker,
    limits: SnapshotConfig,
    held_out: Collection[str] = frozenset(),
    scrub: Scrubber = redact,
) -> PreferenceCuration:
    """Apply the rules of the module docstring to every rated answer on record."""
    counts: Counter[str] = Counter()
    answers: list[_Answer] = []
    for fb in sorted(rated, key=lambda f: (f.at, f.response_id)):
        counts["rated"] += 1
        if (a := _answer(fb, checker, limits, held_out, scrub, counts)) is not None:
            answers.append(a)
    ups: dict[str, list[_Answer]] = {}
    for a in answers:
        if a.src.rating == UP:
            ups.setdefault(a.prompt_key, []).append(a)
    candidates: list[tuple[str, _Answer, str, _Answer | None]] = []
    used: set[str] = set()
    for a in answers:
        if a.src.rating != DOWN:
            continue
        if a.better is not None:
            candidates.append(("better_answer", a, a.better, None))
            used.add(a.src.response_id)
            continue
        partner = next((u for u in ups.get(a.prompt_key, []) if loose_text(u.reply) != loose_text(a.reply)), None)
        if partner is not None:
            candidates.append(("rated", a, partner.reply, partner))
            used |= {a.src.response_id, partner.src.response_id}
    for a in answers:
        counts["used" if a.src.response_id in used else "unpaired"] += 1
    seen: set[tuple[str, str, str]] = set()
    records: list[dict[str, Any]] = []
    redactions: Counter[str] = Counter()
    for kind, rejected, chosen_text, chosen in candidates:
        key = (rejected.prompt_key, loose_text(chosen_text), loose_text(rejected.reply))
        if key in seen:
            counts["duplicate"] += 1
            continue
        seen.add(key)
        record = _pair(kind, rejected, chosen_text, chosen)
        records.append(record)
        counts[f"{kind}_pairs"] += 1
        counts["scrubbed"] += bool(record["metadata"]["scrubbed"])
        redactions += rejected.redactions + (chosen.redactions if chosen else Counter())
    assert counts["rated"] == sum(counts[o] for o in _OUTCOMES), counts
    report = PreferenceReport(
        **{name: counts[name] for name in _COUNTS},
        pairs=len(records),
        unsafe_rules={k[5:]: v for k, v in counts.items() if k.startswith("rule:")},
        invalid_reasons={k[7:]: v for k, v in counts.items() if k.startswith("reason:")},
        redactions=dict(redactions),
    )
    return PreferenceCuration(tuple(records), report)


_OUTCOMES = (
    "not_opted_in",
    "deleted",
    "not_completed",
    "no_context",
    "unsafe",
    "invalid",
    "held_out",
    "used",
    "unpaired",
)
_COUNTS = ("rated", *_OUTCOMES, "better_answer_pairs", "rated_pairs", "duplicate", "scrubbed")
