"""parse_quantity: the Kubernetes quantity grammar, exactly."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st
from neuron_dra.common.quantity import is_quantity, parse_quantity


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", Fraction(0)),
        ("1", Fraction(1)),
        ("+1", Fraction(1)),
        ("-1", Fraction(-1)),
        ("1.5", Fraction(3, 2)),
        (".5", Fraction(1, 2)),
        ("5.", Fraction(5)),
        ("100m", Fraction(1, 10)),
        ("1n", Fraction(1, 10**9)),
        ("1u", Fraction(1, 10**6)),
        ("2k", Fraction(2000)),
        ("3M", Fraction(3 * 10**6)),
        ("1G", Fraction(10**9)),
        ("1T", Fraction(10**12)),
        ("1P", Fraction(10**15)),
        ("1E", Fraction(10**18)),  # exa, not an exponent
        ("1Ki", Fraction(1024)),
        ("16Gi", Fraction(16 * 2**30)),
        ("1.5Gi", Fraction(3 * 2**29)),
        ("1Ti", Fraction(2**40)),
        ("1Pi", Fraction(2**50)),
        ("1Ei", Fraction(2**60)),
        ("1e3", Fraction(1000)),
        ("1E3", Fraction(1000)),
        ("1e-3", Fraction(1, 1000)),
        ("1.5e+2", Fraction(150)),
        ("-2.5e1", Fraction(-25)),
    ],
)
def test_valid(text: str, expected: Fraction) -> None:
    assert parse_quantity(text) == expected
    assert is_quantity(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        " 1",
        "1 ",
        "1 Gi",
        "Gi",
        ".",
        "-",
        "1.2.3",
        "1KI",
        "1ki",
        "1K",
        "1e",
        "1e1.5",
        "1Gib",
        "0x10",
        "1,000",
        "--1",
        "1mi",
        "abc",
        "1e99999",
    ],
)
def test_invalid(text: str) -> None:
    with pytest.raises(ValueError):
        parse_quantity(text)
    assert not is_quantity(text)


def test_non_string_rejected() -> None:
    with pytest.raises(ValueError):
        parse_quantity(5)  # type: ignore[arg-type]


def test_decimal_and_milli_compare_equal() -> None:
    assert parse_quantity("0.1") == parse_quantity("100m") == parse_quantity("1e-1")


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}


@given(
    st.integers(min_value=-(10**12), max_value=10**12),
    st.sampled_from(sorted({**_BINARY, **_DECIMAL})),
)
def test_integer_with_suffix_round_trips(n: int, suffix: str) -> None:
    multiplier = {**_BINARY, **_DECIMAL}[suffix]
    assert parse_quantity(f"{n}{suffix}") == n * Fraction(multiplier)


@given(st.decimals(min_value=-(10**9), max_value=10**9, allow_nan=False, places=6))
def test_decimal_text_round_trips(value: object) -> None:
    text = format(value, "f")
    assert parse_quantity(text) == Fraction(str(value))


@given(st.integers(min_value=0, max_value=10**6), st.integers(min_value=-30, max_value=30))
def test_exponent_form(mantissa: int, exponent: int) -> None:
    assert parse_quantity(f"{mantissa}e{exponent}") == mantissa * Fraction(10) ** exponent
