"""Redaction, table-driven both ways: what must be replaced, and ordinary text that must come through unchanged."""

from __future__ import annotations

import time
from typing import Any

import pytest

from core.redact import luhn_ok, redact

REDACTED = [
    # emails
    ("write to jo@example.com today", "write to [EMAIL] today", "email"),
    ("jo.doe+tag@mail.example.co.uk", "[EMAIL]", "email"),
    ("<first_last@sub-domain.example.org>", "<[EMAIL]>", "email"),
    # phones: international
    ("call +1 415-555-0100 now", "call [PHONE] now", "phone"),
    ("+1 (415) 555-0100", "[PHONE]", "phone"),
    ("+44 20 7946 0958", "[PHONE]", "phone"),
    ("0044 20 7946 0958", "[PHONE]", "phone"),
    ("+14155550100", "[PHONE]", "phone"),
    ("tel:+33-1-23-45-67-89.", "tel:[PHONE].", "phone"),
    # phones: national formats
    ("(415) 555-0100", "[PHONE]", "phone"),
    ("415-555-0100", "[PHONE]", "phone"),
    ("415.555.0100", "[PHONE]", "phone"),
    ("1-800-555-0100", "[PHONE]", "phone"),
    ("020 7946 0958", "[PHONE]", "phone"),
    ("(030) 1234 5678", "[PHONE]", "phone"),
    # cards: Luhn-valid, contiguous or in printed groups
    ("card 4111 1111 1111 1111 exp", "card [CARD] exp", "card"),
    ("4111-1111-1111-1111", "[CARD]", "card"),
    ("5555555555554444", "[CARD]", "card"),
    ("amex 3782 822463 10005", "amex [CARD]", "card"),
    ("378282246310005", "[CARD]", "card"),
    ("4222222222222", "[CARD]", "card"),  # 13-digit Visa
]

UNCHANGED = [
    "2 + 2 = 4",
    "2+2=4",
    "x = 10 + 20 + 30",
    "in 2024 we drove 12.5 km",
    "1,000,000 people",
    "1 000 000 people",
    "192.168.100.200",
    "2024-01-15 10:30:00",
    "ISBN 978-3-16-148410-0",
    "version v1.2.3, +5 points, +12.5%",
    "temperature +20 C",
    "score 3-2-1, pages 10-12",
    "order 4155550100",  # unseparated 10 digits without '+': an id as often as a phone
    "4111 1111 1111 1112",  # card-shaped but fails Luhn
    "4111111111111112",
    "id 12345678901234567890123",  # longer than any card
    "555-0100",  # 7-digit local number: too little to be sure
    "an @ sign alone, user@localhost",
    "",
]


@pytest.mark.parametrize(("text", "expected", "kind"), REDACTED)
def test_personal_data_is_replaced_and_counted(text: str, expected: str, kind: str) -> None:
    out, counts = redact(text)
    assert out == expected
    assert counts == {"email": 0, "phone": 0, "card": 0} | {kind: 1}


@pytest.mark.parametrize("text", UNCHANGED)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert redact(text) == (text, {"email": 0, "phone": 0, "card": 0})


def test_several_kinds_in_one_text() -> None:
    text = "Mail a@b.io or b@c.io, call +1 415-555-0100, pay with 4111111111111111."
    out, counts = redact(text)
    assert out == "Mail [EMAIL] or [EMAIL], call [PHONE], pay with [CARD]."
    assert counts == {"email": 2, "phone": 1, "card": 1}


def test_a_number_written_after_a_phone_does_not_save_the_phone() -> None:
    # the international pattern swallows the trailing groups; whole groups are dropped until E.164 length fits
    out, counts = redact("+1 415 555 0100 1234 5678 9999")
    assert counts["phone"] == 1 and "415" not in out and "0100" not in out


@pytest.mark.parametrize(
    ("digits", "ok"), [("4111111111111111", True), ("4111111111111112", False), ("79927398713", True)]
)
def test_luhn(digits: str, ok: bool) -> None:
    assert luhn_ok(digits) is ok


def _seconds(text: str) -> float:
    """The least CPU time (this process's own: other processes on the machine do not count) of three runs."""
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        redact(text)
        best = min(best, time.process_time() - started)
    return best


@pytest.mark.parametrize(
    "blob",
    [lambda n: "a" * n + "@", lambda n: "1" * n, lambda n: "+1 " * (n // 3), lambda n: "a." * (n // 2) + "@x"],
    ids=["local-part", "digits", "phone-groups", "dotted"],
)
def test_pathological_input_stays_linear(blob: Any) -> None:
    """Growth, not a stopwatch: four times the input takes about four times as long (a quadratic pattern would
    take sixteen; the bound sits between, for noise), whatever this machine's speed."""
    small, large = _seconds(blob(50_000)), _seconds(blob(200_000))
    assert large / max(small, 1e-6) < 11, (small, large)  # 4 when linear, 16 when quadratic; noise between
