"""Money as integer micro-credits: exact parsing of credit strings, formatting, validation.

1 credit = 1,000,000 micro-credits. No float ever holds an amount: credits arrive as decimal
text (or an int, or a `Decimal` that pydantic parsed from JSON) and leave as text.
"""

from __future__ import annotations

import re
from decimal import Decimal

from inference_auctions.billing.errors import InvalidAmount

MICROS_PER_CREDIT = 1_000_000
# One billion credits: far above any real budget, and sums of many such amounts stay inside a
# signed 64-bit column.
MAX_MICROS = 10**9 * MICROS_PER_CREDIT

MAX_AMOUNT_CHARS = 64
_MAX_BITS = 200

_CREDITS = re.compile(r"(?P<int>[0-9]+)(?:\.(?P<frac>[0-9]+))?", re.ASCII)


def parse_credits(value: str | int | Decimal, field: str, maximum: int = MAX_MICROS) -> int:
    """Convert a non-negative amount of credits (at most 6 decimals) to micro-credits, exactly."""
    if isinstance(value, bool):
        raise InvalidAmount(field, f"expected an amount of credits, got {value!r}")
    if isinstance(value, int):
        if abs(value).bit_length() > _MAX_BITS:  # str() of a huge int is itself refused
            raise InvalidAmount(field, "is far above the maximum amount")
        text = str(value)
    elif isinstance(value, Decimal):
        if not value.is_finite():
            raise InvalidAmount(field, f"must be a finite number of credits, got {value}")
        # Written out in full, 1E+999999999 would be a billion digits: refuse it by magnitude.
        if value and abs(value.adjusted()) > MAX_AMOUNT_CHARS:
            raise InvalidAmount(field, "is far outside the range of amounts of credits")
        text = format(value, "f")
    elif isinstance(value, str):
        text = value.strip()
    else:
        raise InvalidAmount(
            field, f"expected a decimal string of credits, got {type(value).__name__}"
        )
    micros = _parse_text(text, field)
    if micros > maximum:
        raise InvalidAmount(
            field, f"{text} credits is above the maximum of {format_micros(maximum)}"
        )
    return micros


def _parse_text(text: str, field: str) -> int:
    # Checked before any digit is converted: Python refuses to build an int of over 4,300
    # digits, and no real amount needs more than a few dozen characters.
    if len(text) > MAX_AMOUNT_CHARS:
        raise InvalidAmount(field, f"{len(text):,} characters is too long for an amount of credits")
    if text.startswith("-"):
        raise InvalidAmount(field, f"must not be negative, got {text!r}")
    if text.lower().lstrip("+") in {"nan", "inf", "infinity", "snan"}:
        raise InvalidAmount(field, f"must be a finite number of credits, got {text!r}")
    match = _CREDITS.fullmatch(text)
    if match is None:
        raise InvalidAmount(
            field, f"expected a decimal number of credits like '1.25', got {text!r}"
        )
    frac = match["frac"] or ""
    if len(frac) > 6:
        raise InvalidAmount(
            field, f"at most 6 decimal places (1 micro-credit) are allowed, got {text!r}"
        )
    return int(match["int"]) * MICROS_PER_CREDIT + int(frac.ljust(6, "0"))


def format_micros(micros: int) -> str:
    """Render micro-credits as credits with exactly 6 decimals, e.g. 1500000 -> '1.500000'."""
    sign = "-" if micros < 0 else ""
    whole, frac = divmod(abs(micros), MICROS_PER_CREDIT)
    return f"{sign}{whole}.{frac:06d}"


# The largest value a signed 64-bit (BIGINT) money column holds.
MAX_TOTAL_MICROS = 2**63 - 1


def check_total_micros(value: object, field: str) -> int:
    """Return `value` if it is a non-negative int sum of amounts that fits a BIGINT column.

    A sum of several valid amounts may exceed `MAX_MICROS`; only the column bounds it.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidAmount(
            field, f"must be an integer number of micro-credits, got {type(value).__name__}"
        )
    if value < 0:
        raise InvalidAmount(field, f"must not be negative, got {value}")
    if value > MAX_TOTAL_MICROS:
        raise InvalidAmount(field, f"{value} is above the maximum of {MAX_TOTAL_MICROS}")
    return value


def check_micros(value: object, field: str, *, positive: bool = False) -> int:
    """Return `value` if it is an int amount in [0, MAX_MICROS] (> 0 when `positive`)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidAmount(
            field, f"must be an integer number of micro-credits, got {type(value).__name__}"
        )
    if value < 0:
        raise InvalidAmount(field, f"must not be negative, got {value}")
    if positive and value == 0:
        raise InvalidAmount(field, "must be positive, got 0")
    if value > MAX_MICROS:
        raise InvalidAmount(field, f"{value} is above the maximum of {MAX_MICROS} micro-credits")
    return value
