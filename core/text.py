"""Client text as the safety checks read it (the model always gets the text as sent).

    normalize_prompt("ｂｏｍｂ") == "bomb"      # what the pre-filter's rules read
    normalize_prompt("bоmb") == "bomb"         # its "о" Cyrillic: a look-alike in Latin text reads as its letter
    classifier_text("b o m b") == "bomb"        # what the harm classifier tokenizes (core.harm_embed)
    classifier_text("b0mb", words) == "bomb"    # with the tokenizer's words: digits for letters read back

``normalize_prompt``: NFKC (full-width and stylized letters fold to ASCII) without zero-width characters, and the
Cyrillic, Greek and Armenian letters that Unicode lists as confusable with one Latin letter (TR39's confusables,
from ``confusable_homoglyphs``) read as that letter: in each word that mixes them with Latin letters, and in words
of look-alikes alone in a text mostly in Latin letters (``fold_lookalikes``). People's harmful requests with their
a, e, o, p, c, x, y and i written in Cyrillic had passed the classifier 53 times in 56, and the rules too
(docs/results.md, "Look-alike letters"). A word with any other letter of those scripts (Russian, Greek) is left as
written.
``classifier_text`` adds two steps. Three or more single letters one space apart are joined into a word: MiniLM's
tokenizer reads them as one-letter words (and does not know full-width letters), and either made a plain request
pass the classifier (docs/results.md, "What a client writes as system"). Digits and symbols are left alone ("3 x 9
= ?" stays); a spaced word right after a one-letter word joins it ("a b o m b" -> "abomb"). And given the
tokenizer's whole words, a word that writes digits for letters is read as the word it spells (``read_digits``).
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Collection
from importlib.resources import files

_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad"), None)
# three or more single letters in a row, one space apart ("h o w  t o  m a k e"): a letter-spaced word
_SPACED = re.compile(r"(?<!\S)(?:[^\W\d_] ){2,}[^\W\d_](?!\S)")
_SCRIPTS = ("CYRILLIC", "GREEK", "ARMENIAN")
_LATIN = re.compile(r"[A-Za-z\u00c0-\u024f]")
_LETTER = re.compile(r"[^\W\d_]")
# leetspeak: the digits written for letters, and the words that hold one after a letter
_DIGIT_LETTERS = str.maketrans("0134578", "oieastb")
_DIGIT = re.compile(r"[0134578]")
_DIGIT_AFTER_LETTER = re.compile(r"[^\W\d_][0-9]")
_WORD_WITH_DIGIT = re.compile(r"[^\W_]*[0134578][^\W_]*")
# digits then a unit of three letters or more: a number as written ("4min" is not "amin"; with two letters or fewer,
# "8am" or "1st", read_digits leaves a word that starts with digits anyway)
_UNITS = "ish wks yrs hrs min mins sec secs lbs mph kph kmh gal gbps mbps khz mhz ghz kwh mah dpi fps bpm"
_NUMBER_WITH_UNIT = re.compile(rf"[0-9]+(?:{'|'.join(_UNITS.split())})")


def _lookalikes() -> dict[str, str]:
    """Each letter of ``_SCRIPTS`` that TR39 lists as confusable with one ASCII letter -> that letter (a capital
    confused with "l" reads as "I", as a capital in English text would)."""
    data = json.loads(files("confusable_homoglyphs").joinpath("confusables.json").read_text(encoding="utf-8"))
    out = {}
    for char, entries in data.items():
        name = unicodedata.name(char, "") if len(char) == 1 else ""
        if name.split(" ")[0] not in _SCRIPTS or "LETTER" not in name:
            continue
        latin = [e["c"] for e in entries if len(e["c"]) == 1 and e["c"].isascii() and e["c"].isalpha()]
        if latin:
            out[char] = "I" if latin[0] == "l" and "CAPITAL" in name else latin[0]
    return out


_FOLD = str.maketrans(_lookalikes())
_LOOKALIKE = re.compile("[" + re.escape("".join(chr(c) for c in _FOLD)) + "]")
_WORD_WITH_LOOKALIKE = re.compile(r"[^\W\d_]*" + _LOOKALIKE.pattern + r"[^\W\d_]*")


def fold_lookalikes(text: str) -> str:
    """``text`` with its look-alike letters read as Latin, word by word: in a word that has Latin letters too (no
    language mixes scripts inside a word); in a word of look-alikes alone when the text has more Latin letters than
    other letters that are not look-alikes. Any other word (Russian "привет") stays as written; so does an ASCII
    text, without a look-up."""
    if text.isascii() or not _LOOKALIKE.search(text):
        return text
    latin = len(_LATIN.findall(text))
    mostly_latin = latin > len(_LETTER.findall(text)) - latin - len(_LOOKALIKE.findall(text))

    def fold(m: re.Match[str]) -> str:
        word = m.group(0)
        if _LATIN.search(word) or mostly_latin and not _LOOKALIKE.sub("", word):
            return word.translate(_FOLD)
        return word  # a word of another script (it has a letter that is no look-alike), or look-alikes alone in a
        # text that is not mostly Latin (Russian "сор")

    return _WORD_WITH_LOOKALIKE.sub(fold, text)


def normalize_prompt(text: str) -> str:
    """NFKC without zero-width characters, look-alike letters in Latin text read as Latin."""
    return fold_lookalikes(unicodedata.normalize("NFKC", text.translate(_INVISIBLE)))


def classifier_text(text: str, words: Collection[str] = ()) -> str:
    """``normalize_prompt``, letter-spaced words joined, and with ``words`` (a tokenizer's whole words, lower
    case), digits written for letters read back (``read_digits``)."""
    text = _SPACED.sub(lambda m: m.group(0).replace(" ", ""), normalize_prompt(text))
    return read_digits(text, words) if words else text


def read_digits(text: str, words: Collection[str]) -> str:
    """Each word that writes digits for letters ("h4ck", "c0c41n3", "7ruck": a digit after a letter, or digits
    before three letters or more) read as the word of ``words`` it spells ("hack", "cocaine", "truck"), when the word
    as written is not one of ``words`` itself. So "mp3", "covid19" and "h264" stay (they spell no word), and so do
    numbers with a unit or an ending ("10am", "8am", "1st", "5mins": never "bam" or "ist") and words under three
    characters or with one letter ("C4", the explosive; "d4", a chess move; "Be3" does read "bee")."""
    if not _DIGIT.search(text):
        return text

    def read(m: re.Match[str]) -> str:
        word = m.group(0)
        low = word.lower()
        letters = len(_LETTER.findall(word))
        if len(word) < 3 or letters < 2 or low in words:
            return word  # "C4", "d4": a name or a chess move, too short to tell from a spelled word
        if not _DIGIT_AFTER_LETTER.search(word) and (letters < 3 or _NUMBER_WITH_UNIT.fullmatch(low)):
            return word  # "8am" ("bam"), "1st" ("ist"), "15bn", "4min" ("amin"): a number with a unit or an ending
        spelled = low.translate(_DIGIT_LETTERS)
        return spelled if spelled in words else word

    return _WORD_WITH_DIGIT.sub(read, text)
