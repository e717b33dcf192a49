"""The post-filter of the gateway: blocked output patterns and the toxicity classifier on replies, streamed or not.

The gateway wraps every streamed reply in ``filters.stream()`` (``serving.safety.SafetyFilters``): ``feed`` each
delta, send what it returns, ``finish`` at the end, stop on ``violation``. Non-streamed replies go through
``check_text``, which gives the same decision as streaming the same text in any chunking.

``StreamFilter.feed`` releases text only once it has been checked and ``holdback_chars`` later characters exist, so no
prefix of a blocked string of up to ``holdback_chars`` characters ever reaches the client. See ``StreamFilter`` for
why the pattern scan is complete and why the decision does not depend on the chunking.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from core.errors import ConfigError
from core.toxicity import ToxicityScorer
from serving.config import SafetyConfig
from serving.verdict import Verdict

TOXICITY_WINDOW_CHARS = 256  # the longest text one toxicity score sees: the current sentence, cut to this
TOXICITY_STRIDE_CHARS = 32  # a sentence still going is scored at least this often (and every holdback_chars / 2)
UNBOUNDED_SCAN_CHARS = 256  # streamed scan horizon of patterns without a maximum length (finish() checks it all)
_TERMINATORS = frozenset(".!?\n")
_HUGE = 1 << 30


@dataclass(frozen=True)
class OutputPattern:
    """A compiled ``blocked_output_patterns`` entry with the widths the streamed scan needs.

    ``width``: the longest match (None: unbounded); ``lookahead``: how far past a match end the pattern may look
    (None: unbounded); ``lookbehind``: how far before a match start it may look.
    """

    index: int
    regex: re.Pattern[str]
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
            regex = re.compile(text, re.IGNORECASE)
            tree = parser.parse(text, re.IGNORECASE)
        except re.error as e:
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
                regex,
                None if high >= _HUGE else high,
                None if lookahead >= _HUGE else lookahead,
                max(behind, default=0),
            )
        )
    return out


def _first_match(patterns: Sequence[OutputPattern], text: str) -> Verdict | None:
    for p in patterns:
        if p.regex.search(text):
            return Verdict(True, "post", f"pattern:{p.index}", f"reply matched blocked_output_patterns[{p.index}]")
    return None


class _Sentences:
    """Toxicity windows at positions that depend on the text only, never on how it was chunked.

    A window ends after every sentence terminator (. ! ? newline) and whenever ``stride`` characters passed since the
    last window end; it covers the current sentence, cut to its last ``width`` characters.
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
            terminal = buf[i - base] in _TERMINATORS
            if terminal or end - self.last >= self.stride:
                out.append((max(self.start, end - self.width), end))
                self.last = end
                if terminal:
                    self.start = end
        return out

    def final(self, length: int) -> tuple[int, int] | None:
        return (max(self.start, length - self.width), length) if length > self.last else None


def _score_windows(scorer: ToxicityScorer, threshold: float, texts: list[str]) -> tuple[Verdict | None, float | None]:
    texts = [t for t in texts if t.strip()]
    if not texts:
        return None, None
    score = max(scorer.score(texts))
    if score >= threshold:
        reason = f"reply scored {score:.3f} >= {threshold} on {scorer.name}"
        return Verdict(True, "post", "toxicity", reason, score), score
    return None, score


class StreamFilter:
    """The post-filter of one streamed reply: ``feed`` deltas, send what it returns, ``finish`` at the end.

    Release rule: after each feed the text is checked, then released up to ``L - holdback_chars`` (L: characters
    generated so far), never past the end of the last scored toxicity window nor past the start of a possible pattern
    match still growing. So a string matching a pattern, of up to ``holdback_chars`` characters, is complete and
    caught before any of it could be released; a toxic phrase of up to ``holdback_chars - stride + 1`` characters
    (25 by default) is scored whole before any of it is released, since windows end every ``stride`` <=
    ``holdback_chars / 2`` characters. Clean text lags by exactly ``holdback_chars``; ``finish`` releases the rest
    after a final check.

    Why the pattern scan is complete. Each pattern keeps ``scan_from``: no match of it can start before. Each feed
    searches the buffer from there (the buffer keeps ``lookbehind`` + 1 characters before, so lookbehind and ``\\b``
    see the same characters as in the whole text). A match [s, e) found in the prefix is *confirmed* when
    ``e + lookahead + 2 <= L``: every character its path inspected is already generated and none of its ``$``/``\\Z``
    could have held at the prefix end, so the same path matches in the whole reply. A match ending later is
    *pending*: nothing from s on is released until more text settles it. And if the search finds nothing before
    position q, no match can start at any p <= L - width - lookahead - 2 below q (it would end early enough to be
    found), so ``scan_from`` advances to min(q, L - width - lookahead - 1). Patterns without a maximum width (or with
    unbounded lookahead) use ``UNBOUNDED_SCAN_CHARS`` instead; a longer match than that, with no shorter match inside
    it, is caught only by ``finish``, which searches the whole reply exactly as ``check_text`` does.

    Why the decision does not depend on chunking. A confirmed match is a match of the whole reply; ``finish`` searches
    the whole reply; toxicity windows end at positions fixed by the text (``_Sentences``), the same in ``check_text``.
    So streamed and whole replies are blocked alike; only the rule reported may differ (which check fired first).

    Cost per feed: O(delta + scanned region + one scorer call per ``stride`` characters), independent of the reply
    length; the buffer is trimmed to what later checks and the release still need.
    """

    def __init__(
        self, cfg: SafetyConfig, scorer: ToxicityScorer, *, patterns: Sequence[OutputPattern] | None = None
    ) -> None:
        self._cfg = cfg
        self._scorer = scorer
        self._patterns = list(compile_output_patterns(cfg.blocked_output_patterns) if patterns is None else patterns)
        self._holdback = cfg.holdback_chars
        stride = max(1, min(cfg.holdback_chars // 2, TOXICITY_STRIDE_CHARS))
        self._sentences = _Sentences(stride, TOXICITY_WINDOW_CHARS)
        self._context = max((p.lookbehind for p in self._patterns), default=0) + 1
        self._parts: list[str] = []  # the whole reply, joined once by finish()
        self._buf = ""  # text from global offset _base
        self._base = 0
        self._length = 0
        self._released = 0
        self._checked = 0  # end of the last scored toxicity window
        self._scan_from = [0] * len(self._patterns)
        self._finished = False
        self.violation: Verdict | None = None
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
        windows = self._sentences.advance(self._buf, self._base, old, self._length)
        if windows:
            if self._score([self._buf[s - self._base : e - self._base] for s, e in windows]):
                return ""
            self._checked = windows[-1][1]
        # scored windows end every stride <= holdback / 2 characters: the toxicity check is never what holds text back
        assert self._checked >= self._length - self._holdback
        upto = max(self._released, min(self._length - self._holdback, pending))
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
        last = self._sentences.final(self._length)
        if self.violation is not None or (
            last and self._score([self._buf[last[0] - self._base : last[1] - self._base]])
        ):
            return ""
        out = self._buf[self._released - self._base :]
        self._released = self._length
        return out

    def check_text(self, text: str) -> Verdict:
        """The decision on a whole (non-streamed) reply; the same as streaming it in any chunking. Stateless."""
        if not self._cfg.post_filter:
            return Verdict(False, "post", None, "post-filter disabled")
        found = _first_match(self._patterns, text)
        if found is not None:
            return found
        sentences = _Sentences(self._sentences.stride, self._sentences.width)
        spans = sentences.advance(text, 0, 0, len(text))
        last = sentences.final(len(text))
        spans += [last] if last else []
        verdict, score = _score_windows(self._scorer, self._cfg.toxicity_threshold, [text[s:e] for s, e in spans])
        return verdict or Verdict(False, "post", None, "passed", score)

    def _scan_patterns(self) -> int:
        """Search each pattern from its ``scan_from``; set ``violation`` on a confirmed match; return how far the
        release may go (the start of the earliest pending match, or L)."""
        limit = self._length
        for k, p in enumerate(self._patterns):
            m = p.regex.search(self._buf, self._scan_from[k] - self._base)
            ahead = UNBOUNDED_SCAN_CHARS if p.lookahead is None else p.lookahead
            settled = self._length - (UNBOUNDED_SCAN_CHARS if p.width is None else p.width) - ahead - 1
            if m is not None:
                start, end = m.start() + self._base, m.end() + self._base
                if p.lookahead is not None and end + p.lookahead + 2 <= self._length:
                    self.violation = Verdict(
                        True, "post", f"pattern:{p.index}", f"reply matched blocked_output_patterns[{p.index}]"
                    )
                    return self._released
                limit = min(limit, start)
                settled = min(settled, start)
            self._scan_from[k] = max(self._scan_from[k], settled)
        return limit

    def _score(self, texts: list[str]) -> bool:
        verdict, score = _score_windows(self._scorer, self._cfg.toxicity_threshold, texts)
        if score is not None:
            self.max_score = score if self.max_score is None else max(self.max_score, score)
        self.violation = verdict
        return verdict is not None

    def _trim(self) -> None:
        keep = min(
            self._released,
            max(self._sentences.start, self._length - TOXICITY_WINDOW_CHARS),
            min(self._scan_from, default=self._length) - self._context,
        )
        if keep - self._base > 512:  # amortized: a slice at most every 512 characters
            self._buf = self._buf[keep - self._base :]
            self._base = keep
