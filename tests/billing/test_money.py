from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inference_auctions.billing import MAX_MICROS, InvalidAmount, format_micros, parse_credits


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        ("0", 0),
        ("1", 1_000_000),
        ("1.5", 1_500_000),
        ("0.000001", 1),
        (" 12.345678 ", 12_345_678),
        ("007.10", 7_100_000),
        (3, 3_000_000),
        (Decimal("2.25"), 2_250_000),
        (Decimal("1E+1"), 10_000_000),
    ],
)
def test_parse_credits_is_exact(text: str | int | Decimal, micros: int) -> None:
    assert parse_credits(text, "bid") == micros


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("-1", "must not be negative"),
        ("0.0000001", "at most 6 decimal places"),
        ("NaN", "finite"),
        ("inf", "finite"),
        ("-Infinity", "must not be negative"),
        ("1e3", "decimal number"),
        ("1,5", "decimal number"),
        ("", "decimal number"),
        ("1_000", "decimal number"),
        ("٣", "decimal number"),
        (Decimal("NaN"), "finite"),
        (1.5, "decimal string"),
        (True, "expected an amount"),
        ("1000000001", "above the maximum"),
    ],
)
def test_parse_credits_refuses_with_the_field_named(text: object, problem: str) -> None:
    with pytest.raises(InvalidAmount, match=problem) as caught:
        parse_credits(text, "bid")  # type: ignore[arg-type]
    assert caught.value.field == "bid"
    assert str(caught.value).startswith("bid: ")


def test_parse_credits_honours_a_lower_maximum() -> None:
    assert parse_credits("2", "budget", maximum=2_000_000) == 2_000_000
    with pytest.raises(InvalidAmount, match=r"above the maximum of 2\.000000"):
        parse_credits("2.000001", "budget", maximum=2_000_000)


@given(st.integers(min_value=0, max_value=MAX_MICROS))
def test_format_then_parse_round_trips(micros: int) -> None:
    assert parse_credits(format_micros(micros), "x") == micros


def test_format_micros_shows_six_decimals_and_sign() -> None:
    assert format_micros(1_500_000) == "1.500000"
    assert format_micros(-1) == "-0.000001"
    assert format_micros(0) == "0.000000"


@pytest.mark.parametrize(
    "value",
    [10**5000, "9" * 5000, Decimal("1E+999999999"), Decimal("1E-9999999")],
    ids=["huge-int", "huge-text", "huge-exponent", "tiny-exponent"],
)
def test_absurd_amounts_are_refused_before_any_conversion(value: object) -> None:
    with pytest.raises(InvalidAmount, match=r"^budget: .*(too long|far)"):
        parse_credits(value, "budget")  # type: ignore[arg-type]
