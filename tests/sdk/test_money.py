"""Exact money conversion."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inference_auctions.sdk import InvalidAmountError, format_credits, to_micros


@pytest.mark.parametrize(
    ("amount", "micros"),
    [
        ("0.02", 20_000),
        ("50", 50_000_000),
        (Decimal("0.000001"), 1),
        (3, 3_000_000),
        (0.1, 100_000),
        (" 1.5 ", 1_500_000),
        ("1E-6", 1),
        ("0", 0),
    ],
)
def test_to_micros_is_exact(amount: object, micros: int) -> None:
    assert to_micros(amount) == micros  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "amount", ["0.0000001", "-1", "NaN", "inf", "abc", "", True, None, [1], 1e-7]
)
def test_to_micros_rejects_what_it_cannot_represent(amount: object) -> None:
    with pytest.raises(InvalidAmountError):
        to_micros(amount)  # type: ignore[arg-type]


def test_invalid_amount_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="value has more than 6 decimals"):
        to_micros("0.1234567", name="value")


@given(st.integers(min_value=0, max_value=10**15))
def test_format_round_trips(micros: int) -> None:
    text = format_credits(micros)
    assert to_micros(text) == micros
    assert len(text.split(".")[1]) == 6


def test_format_examples() -> None:
    assert format_credits(12_345) == "0.012345"
    assert format_credits(50_000_000) == "50.000000"
    assert format_credits(-1) == "-0.000001"
