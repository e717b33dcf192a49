"""The post-filter of the gateway: blocked output patterns and the toxicity classifier on replies, streamed or not.

The gateway wraps every streamed reply in ``filters.stream()`` (``serving.safety.filters.SafetyFilters``): ``feed`` each
delta, send what it returns, ``finish`` at the end, stop on ``violation``. Non-streamed replies go through
``check_text``, which gives the same decision as streaming the same text in any chunking.

``StreamFilter.feed`` releases text as soon as nothing can block it any more, instead of a fixed holdback: text is
held only from the start of a possible match of a blocked pattern (the ``regex`` package's partial matching
answers "could more text complete a match starting here?"), and after the last word the toxicity classifier has
scored (its windows close at every word end and at sentence ends) when the word being written could still become
one the classifier flags. So no character of a blocked string is ever sent, and clean text is sent as it comes.
See ``StreamFilter`` for why the scan is complete and the decision independent of the chunking.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import regex

from core.errors import ConfigError
from core.toxicity import ToxicityScorer
from serving.config import SafetyConfig
from serving.safety.verdict import FilterVerdict

TOXICITY_WINDOW_CHARS = 256  # the longest text one toxicity score sees: the current sentence, cut to this
TOXICITY_STRIDE_CHARS = 32  # a word still going (a URL, code) is scored at least this often
_TERMINATORS = frozenset(".!?\n")
_HUGE = 1 << 30


@dataclass(frozen=True)
class OutputPattern:
    """A compiled ``blocked_output_patterns`` entry with the widths the streamed scan needs.

    ``regex`` is compiled by the ``regex`` package (for its partial matching) from Python ``re`` syntax, which is
    what the widths are measured with. ``width``: the longest match (None: unbounded); ``lookahead``: how far past a
    match end the pattern may look (None: unbounded); ``lookbehind``: how far before a match start it may look.
    """

    index: int
    regex: regex.Pattern[str]
    width: int | None
    lookahead: int | None
    lookbehind: int


def _lookarounds(node: Any) -> Iterator[tuple[int, int]]:
    """(direction, max width) of every lookaround assertion in a parsed pattern (re._parser's tree)."""
    if isinstance(node, list | tuple):
        if len(node) == 2 and getattr(node[0], "name", None) in ("ASSERT", "ASSERT_NOT"):
            direction, sub = node[1]
            yield direction, sub.getwidth()[1]
        for child in node:
            yield from _lookarounds(child)
    elif hasattr(node, "data"):  # a SubPattern
        yield from _lookarounds(node.data)


def compile_output_patterns(patterns: Sequence[str]) -> list[OutputPattern]:
    """Compile and measure every pattern once; a bad one is a ConfigError naming it."""
    parser = importlib.import_module("re._parser")  # the stdlib's own parser: exact widths of what re compiles
    out = []
    for i, text in enumerate(patterns):
        where = f"serving.safety.blocked_output_patterns[{i}] {text!r}"
        try:
            tree = parser.parse(text, re.IGNORECASE)
            compiled = regex.compile(text, regex.IGNORECASE | regex.V0)
        except (re.error, regex.error) as e:
            raise ConfigError(f"config: {where} is not a valid regular expression: {e}") from e
        low, high = tree.getwidth()
        if low == 0:
            raise ConfigError(f"config: {where} can match the empty string, so it would block every reply")
        ahead = [w for d, w in _lookarounds(tree) if d == 1]
        behind = [w for d, w in _lookarounds(tree) if d == -1]
        lookahead = max(ahead, default=0)
        out.append(
            OutputPattern(
                i,
                compiled,
                None if high >= _HUGE else high,
                None if lookahead >= _HUGE else lookahead,
                max(behind, default=0),
            )
        )
    return out


def _first_match(patterns: Sequence[OutputPattern], text: str) -> FilterVerdict | None:
    for p in patterns:
        if p.regex.search(text):
            return FilterVerdict(
                True, "post", f"pattern:{p.index}", f"reply matched blocked_output_patterns[{p.index}]"
            )
    return None


class _Windows:
    """Toxicity windows at positions that depend on the text only, never on how it was chunked.

    A window ends after every character that is not part of a word (not a letter, digit or underscore: spaces,
    punctuation, the sentence terminators . ! ? and newline), and whenever ``stride`` characters passed since the
    last window end (a long URL or identifier); it covers the current sentence up to there, cut to its last
    ``width`` characters. Text is released only up to the end of the last window scored, so a word is scored, in
    its sentence, before any of it is sent; a terminator closes the sentence.
    """

    def __init__(self, stride: int, width: int) -> None:
        self.stride = stride
        self.width = width
        self.last = 0  # end of the last window
        self.start = 0  # start of the current sentence

    def advance(self, buf: str, base: int, old: int, new: int) -> list[tuple[int, int]]:
        """Windows (global start, end) ending in (old, new]; ``buf`` holds the text from global offset ``base``."""
        out = []
        for i in range(old, new):
            end = i + 1
            ch = buf[i - base]
            if not _is_word(ch) or end - self.last >= self.stride:
                out.append((max(self.start, end - self.width), end))
                self.last = end
                if ch in _TERMINATORS:
                    self.start = end
        return out

    def final(self, length: int) -> tuple[int, int] | None:
        return (max(self.start, length - self.width), length) if length > self.last else None


def _is_word(ch: str) -> bool:
    """A character the classifier's tokenizer counts as part of a word (``\\w``)."""
    return ch.isalnum() or ch == "_"


def _score_windows(
    scorer: ToxicityScorer, threshold: float, texts: list[str]
) -> tuple[FilterVerdict | None, float | None]:
    texts = [t for t in texts if t.strip()]
    if not texts:
        return None, None
    score = max(scorer.score(texts))
    if score >= threshold:
        reason = f"reply scored {score:.3f} >= {threshold} on {scorer.name}"
        return FilterVerdict(True, "post", "toxicity", reason, score), score
    return None, score


class StreamFilter:
    """The post-filter of one streamed reply: ``feed`` deltas, send what it returns, ``finish`` at the end.

    Release rule: after each feed the text is checked, then released up to the earliest of (a) the start of a
    possible match of any blocked pattern and (b) the end of the last toxicity window scored (``_Windows``: every
    word end), or the end of the text when the word being written cannot become a word the classifier flags
    (``word_prefixes``: every prefix of every word that alone scores at the threshold; the production scorer's
    model sees single words only). A string matching a pattern is therefore complete and caught before any
    character of it could be released, whatever its length; a word that may be flagged is scored in its sentence
    before any of it is released. ``finish`` releases the rest after a final check.

    Why the pattern scan is complete. Each pattern keeps ``scan_from``: no match of it can start before, in this
    text or any continuation of it. Each feed searches the buffer from there with partial matching (the buffer
    keeps ``lookbehind`` + 1 characters before, so lookbehind and ``\\b`` see the same characters as in the whole
    text): the leftmost position where a match either exists or could still be completed by more text. Nothing
    from there on is released, and ``scan_from`` moves up to it. A match found there is *confirmed* when
    ``end + lookahead + 2 <= L``: every character its path inspected is already generated and none of its
    ``$``/``\\Z``/``\\b`` could have held at the prefix end, so the same path matches in the whole reply; then the
    reply is stopped. A match ending later is *pending* (more text may undo it: ``secret\\b`` before ``s``), and
    holds the text from its start like a partial one. Patterns with unbounded lookahead are never confirmed
    mid-stream: their text is held and ``finish`` decides, searching the whole reply exactly as ``check_text``.

    Why the decision does not depend on chunking. A confirmed match is a match of the whole reply; ``finish``
    searches the whole reply; toxicity windows end at positions fixed by the text (``_Windows``), the same in
    ``check_text``. So streamed and whole replies are blocked alike; only the rule reported may differ (which check
    fired first).

    Cost per feed: O(delta + held region + one scorer call per word), independent of the reply length; the buffer
    is trimmed to what later checks and the release still need.
    """

    def __init__(
        self,
        cfg: SafetyConfig,
        scorer: ToxicityScorer,
        *,
        patterns: Sequence[OutputPattern] | None = None,
        word_prefixes: frozenset[str] | None = None,
    ) -> None:
        self._cfg = cfg
        self._scorer = scorer
        self._prefixes = word_prefixes  # None: any word may become a flagged one (hold each until it ends)
        self._longest = max(map(len, word_prefixes), default=0) if word_prefixes is not None else 0
        self._patterns = list(compile_output_patterns(cfg.blocked_output_patterns) if patterns is None else patterns)
        self._windows = _Windows(TOXICITY_STRIDE_CHARS, TOXICITY_WINDOW_CHARS)
        self._context = max((p.lookbehind for p in self._patterns), default=0) + 1
        self._parts: list[str] = []  # the whole reply, joined once by finish()
        self._buf = ""  # text from global offset _base
        self._base = 0
        self._length = 0
        self._released = 0
        self._checked = 0  # end of the last scored toxicity window
        self._scan_from = [0] * len(self._patterns)
        self._finished = False
        self.violation: FilterVerdict | None = None
        self.max_score: float | None = None  # highest toxicity score seen, for logs

    @property
    def released_chars(self) -> int:
        return self._released

    def feed(self, delta: str) -> str:
        """The text that may be sent now (often ""); "" forever once ``violation`` is set."""
        if self.violation is not None or not delta:
            return ""
        assert not self._finished, "feed() after finish()"
        if not self._cfg.post_filter:
            self._released += len(delta)
            return delta
        old = self._length
        self._parts.append(delta)
        self._buf += delta
        self._length += len(delta)
        pending = self._scan_patterns()
        if self.violation is not None:
            return ""
        windows = self._windows.advance(self._buf, self._base, old, self._length)
        if windows:
            if self._score([self._buf[s - self._base : e - self._base] for s, e in windows]):
                return ""
            self._checked = windows[-1][1]
        checked = self._checked if self._word_may_flag() else self._length
        upto = max(self._released, min(checked, pending))
        out = self._buf[self._released - self._base : upto - self._base]
        self._released = upto
        self._trim()
        return out

    def finish(self) -> str:
        """The rest of the reply after a final check of the whole text, or "" when it is blocked (or on a repeat)."""
        if self._finished or self.violation is not None or not self._cfg.post_filter:
            self._finished = True
            return ""
        self._finished = True
        self.violation = _first_match(self._patterns, "".join(self._parts))
        last = self._windows.final(self._length)
        if self.violation is not None or (
            last and self._score([self._buf[last[0] - self._base : last[1] - self._base]])
        ):
            return ""
        out = self._buf[self._released - self._base :]
        self._released = self._length
        return out

    def check_text(self, text: str) -> FilterVerdict:
        """The decision on a whole (non-streamed) reply; the same as streaming it in any chunking. Stateless."""
        if not self._cfg.post_filter:
            return FilterVerdict(False, "post", None, "post-filter disabled")
        found = _first_match(self._patterns, text)
        if found is not None:
            return found
        windows = _Windows(self._windows.stride, self._windows.width)
        spans = windows.advance(text, 0, 0, len(text))
        last = windows.final(len(text))
        spans += [last] if last else []
        verdict, score = _score_windows(self._scorer, self._cfg.toxicity_threshold, [text[s:e] for s, e in spans])
        return verdict or FilterVerdict(False, "post", None, "passed", score)

    def _scan_patterns(self) -> int:
        """Search each pattern from its ``scan_from``, partial matches included; set ``violation`` on a confirmed
        match; return how far the release may go (the start of the earliest possible or pending match, or L)."""
        limit = self._length
        for k, p in enumerate(self._patterns):
            m = p.regex.search(self._buf, self._scan_from[k] - self._base, partial=True)
            if m is None:  # no match can start anywhere in this text or its continuations (a lookbehind-only case)
                self._scan_from[k] = self._length
                continue
            start, end = m.start() + self._base, m.end() + self._base
            if not m.partial and p.lookahead is not None and end + p.lookahead + 2 <= self._length:
                self.violation = FilterVerdict(
                    True, "post", f"pattern:{p.index}", f"reply matched blocked_output_patterns[{p.index}]"
                )
                return self._released
            limit = min(limit, start)
            self._scan_from[k] = start
        return limit

    def _word_may_flag(self) -> bool:
        """Whether the word being written (the run of word characters ending the text) could still become a word
        the classifier flags."""
        if self._prefixes is None:
            return True
        start = self._length
        while start > max(self._base, self._length - self._longest - 1) and _is_word(self._buf[start - 1 - self._base]):
            start -= 1
        word = self._buf[start - self._base :].lower()
        return bool(word) and len(word) <= self._longest and word in self._prefixes

    def _score(self, texts: list[str]) -> bool:
        verdict, score = _score_windows(self._scorer, self._cfg.toxicity_threshold, texts)
        if score is not None:
            self.max_score = score if self.max_score is None else max(self.max_score, score)
        self.violation = verdict
        return verdict is not None

    def _trim(self) -> None:
        keep = min(
            self._released,
            max(self._windows.start, self._length - TOXICITY_WINDOW_CHARS),
            min(self._scan_from, default=self._length) - self._context,
        )
        if keep - self._base > 512:  # amortized: a slice at most every 512 characters
            self._buf = self._buf[keep - self._base :]
            self._base = keep
