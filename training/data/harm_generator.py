"""The safety classifier's prompt generator: every frame, action and statement of its pools (``harm_pools``,
continued by ``harm_pools_more``), put together and dealt to a split by position, plus training-only concepts
(``harm_pools_train``: each action in a few training frames, and, with ``statements``, whole statements in a few
surface forms, which the classifier's snapshot takes by default and the chat generator's draw does not, and with
``twins`` each harmful concept's benign twin, ``harm_pools_twins``, with ``meta`` the turns people send about the
conversation itself, ``harm_pools_meta``, and with ``discreet`` lawful requests for discretion, ``harm_pools_discreet``;
never in an eval split).

    splits = generate_harm()       # {"train": [...], "validation": [...], "test": [...]}
    split_of(7)                    # "validation"

A record is ``{"text", "label", "kind", "wording", "source"}``: ``label`` a harm category or ``benign``, ``kind``
``harmful``, ``benign_risky`` or ``benign``, ``wording`` the units it is made of (``f3+weapons.a7``). The harm
snapshot (``harm_synth``) builds on it, and the chat generator's varied skills draw from its training split.
"""

from __future__ import annotations

import re

from training.data.harm_pools import ACTIONS, FRAMES, LEXICON, STATEMENTS
from training.data.harm_pools_discreet import DISCREET_ASKS
from training.data.harm_pools_meta import META_TURNS
from training.data.harm_pools_more import (
    INVENTED_SYLLABLES,
    INVENTED_TEMPLATES,
    MORE_ACTIONS,
    MORE_FRAMES,
    MORE_STATEMENTS,
)
from training.data.harm_pools_train import TRAIN_ACTION_FRAMES, TRAIN_ACTIONS, TRAIN_STATEMENTS
from training.data.harm_pools_twins import TRAIN_TWINS
from training.data.snapshot import SPLITS

# the generator's pools: harm_pools' lists continued by harm_pools_more's (positions, hence splits, carry on)
ALL_FRAMES: tuple[str, ...] = FRAMES + MORE_FRAMES
ALL_ACTIONS: dict[str, tuple[str, ...]] = {c: ACTIONS[c] + MORE_ACTIONS.get(c, ()) for c in ACTIONS}
ALL_STATEMENTS: dict[str, tuple[str, ...]] = {c: STATEMENTS[c] + MORE_STATEMENTS.get(c, ()) for c in STATEMENTS}


# the wording of a training-only concept's prompt (``f<frame>+<class>.t<action>`` or ``<class>.ts<statement>``)
TRAINING_ONLY = re.compile(r"f\d+\+\w+\.t\d+|\w+\.ts\d+")
# a training-only statement's surface forms: as written, as a sentence, after an opener (rotating)
STATEMENT_OPENERS = ("hey, ", "ok so ", "honestly, ", "hi. ")
QUESTION_WORDS = frozenset(
    ("are", "am", "can", "could", "do", "does", "did", "is", "will", "would", "what", "who", "how", "why", "should")
)


def statement_forms(text: str, n: int) -> list[str]:
    """``text`` as written, capitalized with an end mark (? for a question), and after the ``n``-th opener."""
    first = text.split(maxsplit=1)[0].lower()
    mark = "?" if first in QUESTION_WORDS else "."
    return [text, text[0].upper() + text[1:] + mark, STATEMENT_OPENERS[n % len(STATEMENT_OPENERS)] + text]


def is_training_only(record: dict[str, str]) -> bool:
    """Whether ``record`` asks one of ``harm_pools_train``'s concepts (the classifier's own: never in an eval
    split, and kept out of the chat recipes' data)."""
    return TRAINING_ONLY.fullmatch(record["wording"]) is not None


def split_of(position: int) -> str:
    """The split of the frame, action or statement at ``position`` of its list: 3 of 5 train, 1 validation, 1 test."""
    return ("train", "train", "train", "validation", "test")[position % 5]


def _framed(frame: str, action: str) -> str:
    text = frame.format(x=action)
    return text[0].upper() + text[1:] if frame[0].isupper() else text


def _kind(cls: str) -> str:
    return "benign_risky" if cls == "benign_risky" else "benign" if cls == "benign" else "harmful"


def _label(cls: str) -> str:
    return "benign" if cls in ("benign", "benign_risky") else cls


def generate_harm(
    statements: bool = False, twins: int = 0, meta: bool = False, discreet: bool = False
) -> dict[str, list[dict[str, str]]]:
    """Every generated prompt, by split: the frames of a split times the actions of that split, per class, plus
    the split's statements; with ``statements``, ``harm_pools_train.TRAIN_STATEMENTS`` in the training split too
    (``safety_classifier.statements``: on by default since 2026-12-07, docs/results.md "The statements by
    default"; the function's own default leaves them out, as the chat generator draws); with ``twins``, each
    training-only harmful action's benign twin (``harm_pools_twins``) in the first ``twins`` of its frames too
    (``safety_classifier.twins``, off by default); with ``meta``, ``harm_pools_meta.META_TURNS`` in the training split
    as benign statements (``safety_classifier.meta_turns``, off by default); with ``discreet``,
    ``harm_pools_discreet.DISCREET_ASKS`` in the training split as benign statements that sound risky
    (``safety_classifier.discreet``: on by default since 2026-12-07, docs/results.md "Requests for discretion").
    Deterministic (no randomness: the pools are small enough to use whole)."""
    out: dict[str, list[dict[str, str]]] = {s: [] for s in SPLITS}
    for cls, actions in ALL_ACTIONS.items():
        for ai, action in enumerate(actions):
            for fi, frame in enumerate(ALL_FRAMES):
                if split_of(fi) != split_of(ai):
                    continue
                text = _framed(frame, action)
                record = {"text": text, "label": _label(cls), "kind": _kind(cls), "wording": f"f{fi}+{cls}.a{ai}"}
                out[split_of(ai)].append({**record, "source": "generator"})
    train_frames = [(fi, f) for fi, f in enumerate(ALL_FRAMES) if split_of(fi) == "train"]
    for cls, (verbs, objects) in LEXICON.items():
        for vi, verb in enumerate(verbs):
            for oi, obj in enumerate(objects):
                fi, frame = train_frames[(vi * len(objects) + oi) % len(train_frames)]  # one frame each, in turn
                text = frame.format(x=f"{verb} {obj}")
                record = {"text": text, "label": _label(cls), "kind": _kind(cls), "wording": f"f{fi}+{cls}.v{vi}o{oi}"}
                out["train"].append({**record, "source": "generator"})
    for ci, (cls, actions) in enumerate(TRAIN_ACTIONS.items()):  # training-only concepts, a few frames each
        twinned = TRAIN_TWINS.get(cls, ())
        for ai, action in enumerate(actions):
            for j in range(TRAIN_ACTION_FRAMES):
                fi, frame = train_frames[(ai * TRAIN_ACTION_FRAMES + j + 5 * ci) % len(train_frames)]
                text = _framed(frame, action)
                record = {"text": text, "label": _label(cls), "kind": _kind(cls), "wording": f"f{fi}+{cls}.t{ai}"}
                out["train"].append({**record, "source": "generator"})
                if twinned and j < twins:  # its benign twin in the same frame: the pair differs in purpose only
                    text, wording = _framed(frame, twinned[ai]), f"f{fi}+{cls}_twin.t{ai}"
                    record = {"text": text, "label": "benign", "kind": "benign_risky", "wording": wording}
                    out["train"].append({**record, "source": "generator"})
    # whole training-only prompts (the classifier config's default takes them)
    for cls, whole in TRAIN_STATEMENTS.items() if statements else ():
        for si, statement in enumerate(whole):
            for text in statement_forms(statement, si):
                record = {"text": text, "label": _label(cls), "kind": _kind(cls), "wording": f"{cls}.ts{si}"}
                out["train"].append({**record, "source": "generator"})
    benign_pools = (  # "your answer got cut off, finish it"; "hide the presents so the kids don't find them"
        ("meta", META_TURNS if meta else (), "benign"),
        ("discreet", DISCREET_ASKS if discreet else (), "benign_risky"),
    )
    for prefix, pool, kind in benign_pools:
        for si, statement in enumerate(pool):
            for text in statement_forms(statement, si):
                record = {"text": text, "label": "benign", "kind": kind, "wording": f"{prefix}.ts{si}"}
                out["train"].append({**record, "source": "generator"})
    syl = INVENTED_SYLLABLES
    for ni in range(len(syl) * 4):  # invented names, two or three syllables, each in one template in turn
        name = (syl[ni % len(syl)] + syl[(ni * 5 + 1) % len(syl)] + syl[(ni * 7 + 3) % len(syl)][: ni % 4]).title()
        ti = ni % len(INVENTED_TEMPLATES)
        text = INVENTED_TEMPLATES[ti].format(n=name)
        out["train"].append(
            {"text": text, "label": "benign", "kind": "benign", "wording": f"invented.t{ti}", "source": "generator"}
        )
    for cls, dealt in ALL_STATEMENTS.items():
        for si, text in enumerate(dealt):
            record = {"text": text, "label": _label(cls), "kind": _kind(cls), "wording": f"{cls}.s{si}"}
            out[split_of(si)].append({**record, "source": "generator"})
    return out
