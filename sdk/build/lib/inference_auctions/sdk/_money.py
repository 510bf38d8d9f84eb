"""Exact conversion between credits as users write them and integer micro-credits."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from ._constants import MICROS_PER_CREDIT
from ._exceptions import InvalidAmountError
from ._types import Money

__all__ = ["format_credits", "to_micros"]


def to_micros(amount: Money, *, name: str = "amount") -> int:
    """Convert credits (at most 6 decimals, not negative) to micro-credits exactly."""
    if isinstance(amount, bool):
        raise InvalidAmountError(f"{name} must be a number of credits, not a bool")
    if isinstance(amount, int):
        credits = Decimal(amount)
    elif isinstance(amount, float):
        # repr() is the shortest string that round-trips, i.e. what the user typed:
        # 0.02 means two hundredths, not the binary fraction nearest to it.
        credits = _parse(repr(amount), name)
    elif isinstance(amount, Decimal):
        credits = amount
    elif isinstance(amount, str):
        credits = _parse(amount.strip(), name)
    else:
        raise InvalidAmountError(f"{name} must be a Decimal, str, int or float, not {amount!r}")
    if not credits.is_finite():
        raise InvalidAmountError(f"{name} must be finite, got {amount!r}")
    if credits < 0:
        raise InvalidAmountError(f"{name} must not be negative, got {amount!r}")
    micros = credits * MICROS_PER_CREDIT
    if micros != micros.to_integral_value():
        raise InvalidAmountError(f"{name} has more than 6 decimals: {amount!r}")
    return int(micros)


def format_credits(micros: int) -> str:
    """Render micro-credits as a decimal string of credits, e.g. 12345 -> "0.012345"."""
    if micros < 0:
        return "-" + format_credits(-micros)
    whole, frac = divmod(micros, MICROS_PER_CREDIT)
    return f"{whole}.{frac:06d}"


def _parse(text: str, name: str) -> Decimal:
    try:
        return Decimal(text)
    except InvalidOperation:
        raise InvalidAmountError(f"{name} is not a number: {text!r}") from None
