"""Re-export of ``core.redact`` (the redactor moved to core so training's curation can use it too)."""

from core.redact import KINDS, MAX_PHONE_DIGITS, MIN_PHONE_DIGITS, PLACEHOLDERS, luhn_ok, redact

__all__ = ["KINDS", "MAX_PHONE_DIGITS", "MIN_PHONE_DIGITS", "PLACEHOLDERS", "luhn_ok", "redact"]
