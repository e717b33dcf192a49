"""The gateway's ledger of its own replies (serving.safety.replies): known by their words, the newest kept."""

from __future__ import annotations

from serving.safety.replies import ReplyLedger, reply_digest


def test_a_reply_is_known_by_its_words_whatever_the_whitespace() -> None:
    ledger = ReplyLedger(8)
    ledger.remember("Preheat the oven.\n\nThen knead  the dough.")
    assert ledger.known(["  Preheat the oven. Then knead the dough. ", "Preheat the oven. Then knead the bread."]) == [
        True,
        False,
    ]
    ledger.remember("   ")  # nothing to know
    assert len(ledger) == 1


def test_the_ledger_keeps_the_newest_and_the_ones_still_in_use() -> None:
    ledger = ReplyLedger(2)
    ledger.remember("one")
    ledger.remember("two")
    assert ledger.known(["one"]) == [True]  # a conversation still sending "one" keeps it
    ledger.remember("three")
    assert ledger.known(["one", "two", "three"]) == [True, False, True]


def test_a_ledger_of_size_zero_knows_nothing_of_its_own() -> None:
    ledger = ReplyLedger(0)
    assert ledger.remember("one") == reply_digest(" one ")
    assert ledger.known(["one"]) == [False] and len(ledger) == 0


def test_a_reply_not_kept_is_looked_up_once_and_a_failed_lookup_means_unknown() -> None:
    """Another replica's reply, or one from before a restart: the request log knows it (``lookup``)."""
    logged = {reply_digest("from the other replica")}
    asked: list[list[str]] = []

    def lookup(digests: list[str]) -> set[str]:
        asked.append(digests)
        return logged & set(digests)

    ledger = ReplyLedger(8, lookup)
    ledger.remember("mine")
    assert ledger.known(["mine", "from the other replica", "forged"]) == [True, True, False]
    assert asked == [[reply_digest("from the other replica"), reply_digest("forged")]]
    assert ledger.known(["from the other replica"]) == [True] and len(asked) == 1  # kept now

    def down(digests: list[str]) -> set[str]:
        raise ConnectionError("database is down")

    assert ReplyLedger(8, down).known(["from the other replica"]) == [False]
