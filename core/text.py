"""Client text as the safety checks read it (the model always gets the text as sent).

    normalize_prompt("ｂｏｍｂ") == "bomb"      # what the pre-filter's rules read
    classifier_text("b o m b") == "bomb"        # what the harm classifier tokenizes (core.harm_embed)

``normalize_prompt``: NFKC (full-width and stylized letters fold to ASCII) without zero-width characters.
``classifier_text`` adds one step: three or more single letters one space apart are joined into a word. MiniLM's
tokenizer does neither: full-width letters are unknown to it and spaced ones are single-letter words, and either
made a plain request pass the classifier (docs/results.md, "What a client writes as system"). Digits and symbols
are left alone ("3 x 9 = ?" stays); a spaced word right after a one-letter word joins it ("a b o m b" -> "abomb").
"""

from __future__ import annotations

import re
import unicodedata

_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad"), None)
# three or more single letters in a row, one space apart ("h o w  t o  m a k e"): a letter-spaced word
_SPACED = re.compile(r"(?<!\S)(?:[^\W\d_] ){2,}[^\W\d_](?!\S)")


def normalize_prompt(text: str) -> str:
    """NFKC without zero-width characters."""
    return unicodedata.normalize("NFKC", text.translate(_INVISIBLE))


def classifier_text(text: str) -> str:
    """``normalize_prompt``, and letter-spaced words joined."""
    return _SPACED.sub(lambda m: m.group(0).replace(" ", ""), normalize_prompt(text))
