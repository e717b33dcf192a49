"""On-policy preference pairs: each pair contrasts what the model being tuned says with what it should say.

    drawn = draw(cfg.preference.data, avoid=eval_phrasings, exclude=eval_prompts)
    pairs, summary = contrast_pairs(drawn, policy=open_policy, base=open_base, cfg=cfg.preference.data)

The generator's pairs (``synth_pairs.py``) set a written reply against another written reply. For a pretrained
model both are text it would never say ("Sure. For a pipe bomb, sketch the design..."), and DPO on them moved the
SFT version along one line, refusing more or answering more, never telling the two apart (docs/results.md). Here
the prompts are the varied skills' (``synth.varied_pools``: the safety classifier generator's training split,
phrasings of the eval items left out), and one side of each pair is a model's own greedy reply:

- ``refusal_varied`` (a harmful request): chosen the category's refusal (the one SFT taught); rejected the
  policy's reply when it is not a refusal (its own mistake), else the base model's when that is not one (what the
  model says without the safety tuning), else no pair.
- ``borderline_varied``, ``everyday_varied`` (benign requests, the first kind sounding risky): chosen the base
  model's reply, usable as in stage self-replies (not a refusal; cut at ``max_tokens``, trimmed to its last
  sentence); rejected the policy's reply when it is a refusal (its over-refusal), else no pair: the policy
  answers already, and the base's answer over its own teaches nothing about refusing.

The policy is the SFT version the preference stage starts from, so the pairs are made again for each version; the
base model answers only the prompts that need it. ``summary`` counts the drawn prompts and why a prompt made no
pair, for the pair snapshot's provenance.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.hashing import sha256_files, sha256_json
from core.refusal import is_refusal
from training.config import POLICY_PAIR_KINDS, PairDataConfig
from training.data.records import loose_text, normalize_text
from training.data.self_replies import Generated, GreedyChat, usable
from training.data.synth import Record, varied_pools

STREAM = "preference"
OpenChat = Callable[[], AbstractContextManager[GreedyChat]]


@dataclass(frozen=True)
class Drawn:
    """A prompt drawn for an on-policy pair: its kind, category and (harmful ones) the refusal SFT taught."""

    kind: str
    prompt: str
    category: str
    refusal: str | None = None


def code_hash() -> str:
    """Hash of the rules that decide a pair (this module, self-replies' ``usable``, the refusal detector): part of
    the on-policy pairs' cache key."""
    here = Path(__file__).parent
    return sha256_json(
        [
            sha256_files(here, ("policy_pairs.py", "self_replies.py")),
            sha256_files(here.parents[1] / "core", ("refusal.py",)),
        ]
    )


def wanted(cfg: PairDataConfig) -> dict[str, int]:
    """The on-policy kinds ``cfg`` counts (none: the pairs need no model)."""
    return {k: n for k, n in cfg.counts.items() if k in POLICY_PAIR_KINDS and n > 0}


def draw(cfg: PairDataConfig, *, avoid: Sequence[str], exclude: set[str]) -> list[Drawn]:
    """Up to ``cfg.counts[kind]`` prompts of each on-policy kind, none in ``exclude`` (``loose_text``) nor sharing a
    phrasing with ``avoid``, each kind on its own seeded stream."""
    pools = varied_pools(avoid)
    out: list[Drawn] = []
    for kind, n in wanted(cfg).items():
        items = [(turns, meta) for turns, meta in pools[kind] if loose_text(turns[0][0]) not in exclude]
        for turns, meta in random.Random(f"{STREAM}:{kind}:{cfg.seed}").sample(items, min(n, len(items))):
            (prompt, reply), *_ = turns
            refusal = reply if meta.get("expected") == "refuse" else None
            out.append(Drawn(kind, prompt, str(meta["category"]), refusal))
    return out


def _greedy(open_chat: OpenChat, prompts: Sequence[str], max_tokens: int) -> list[Generated]:
    if not prompts:
        return []
    with open_chat() as chat:
        return list(chat.greedy([[{"role": "user", "content": p}] for p in prompts], max_tokens))


def _pair(d: Drawn, chosen: str, rejected: str, chosen_from: str, rejected_from: str) -> Record:
    return {
        "messages": [{"role": "user", "content": d.prompt}],
        "chosen": chosen,
        "rejected": rejected,
        "metadata": {
            "source": "synthetic",
            "kind": d.kind,
            "category": d.category,
            "chosen_from": chosen_from,
            "rejected_from": rejected_from,
        },
    }


def contrast_pairs(
    drawn: Sequence[Drawn], *, policy: OpenChat, base: OpenChat, cfg: PairDataConfig
) -> tuple[list[Record], dict[str, Any]]:
    """The pairs of ``drawn`` (the rules in the module docstring) and a summary: prompts drawn and paired per
    kind, and why the others made no pair."""
    own = [normalize_text(r.text) for r in _greedy(policy, [d.prompt for d in drawn], cfg.max_tokens)]
    refused = [is_refusal(text) for text in own]
    complied = [bool(text) and not r for text, r in zip(own, refused, strict=True)]
    # the base answers only where it can make a pair: a harmful prompt the policy did not comply with, a benign one
    # it refused
    need = [i for i, d in enumerate(drawn) if (not complied[i] if d.refusal is not None else refused[i])]
    base_replies = dict(zip(need, _greedy(base, [drawn[i].prompt for i in need], cfg.max_tokens), strict=True))
    pairs: list[Record] = []
    unpaired: Counter[str] = Counter()
    for i, d in enumerate(drawn):
        if d.refusal is not None:  # harmful
            base_text = normalize_text(base_replies[i].text) if i in base_replies else ""
            if complied[i]:
                pairs.append(_pair(d, d.refusal, own[i], "generated", "policy"))
            elif base_text and not is_refusal(base_text):
                pairs.append(_pair(d, d.refusal, base_text, "generated", "base"))
            else:
                unpaired["harmful_refused_by_both"] += 1
        elif not refused[i]:
            unpaired["benign_answered_by_policy" if own[i] else "benign_policy_empty"] += 1
        else:
            answer, why = usable(base_replies[i], cfg.cut_replies)
            if why is None:
                pairs.append(_pair(d, answer, own[i], "base", "policy"))
            else:
                unpaired[f"benign_base_{why}"] += 1
    summary = {
        "drawn": dict(Counter(d.kind for d in drawn)),
        "paired": dict(Counter(str(p["metadata"]["kind"]) for p in pairs)),
        "rejected_from": dict(Counter(str(p["metadata"]["rejected_from"]) for p in pairs)),
        "unpaired": dict(sorted(unpaired.items())),
    }
    return pairs, summary
