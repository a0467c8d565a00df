"""Kubernetes resource quantities (``16Gi``, ``500m``, ``1e3``) as exact fractions.

The fake API server needs this to reject capacities the real server would not decode, and the
simulated scheduler compares capacities, so the value is exact (``fractions.Fraction``) rather
than a float: ``0.1`` and ``100m`` must compare equal and ``1Ei`` must not lose bits.

Grammar accepted (the one documented for ``resource.Quantity``)::

    quantity   = sign? number suffix
    number     = digits | digits "." digits? | "." digits
    suffix     = "" | binarySI | decimalSI | ("e" | "E") sign? digits
    binarySI   = Ki | Mi | Gi | Ti | Pi | Ei
    decimalSI  = n | u | m | k | M | G | T | P | E

No whitespace is allowed anywhere. An exponent that looks like a suffix (``1E`` = exa) is read as
the suffix, as the real parser does.
"""

from __future__ import annotations

import re
from fractions import Fraction

# What the real server quotes in its decode error, so messages line up with it.
QUANTITY_REGEX_TEXT = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"

_BINARY = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}

_NUMBER = re.compile(r"([+-]?)([0-9]+\.?[0-9]*|\.[0-9]+)(.*)", re.DOTALL)
_EXPONENT = re.compile(r"[eE]([+-]?[0-9]+)")

# Exponents far outside what int64/Quantity can hold would make Fraction arithmetic slow for no
# benefit; the real parser also gives up on them.
_MAX_EXPONENT = 1000


def parse_quantity(text: str) -> Fraction:
    """Parse ``text`` into its exact value; raise ``ValueError`` if it is not a valid quantity."""
    if not isinstance(text, str):
        raise ValueError(f"quantity must be a string, got {type(text).__name__}")
    match = _NUMBER.fullmatch(text)
    if match is None:
        raise ValueError(f"quantities must match the regular expression '{QUANTITY_REGEX_TEXT}'")
    sign, number, suffix = match.groups()
    value = _parse_decimal(number)
    if sign == "-":
        value = -value
    return value * _suffix_multiplier(suffix)


def is_quantity(text: str) -> bool:
    try:
        parse_quantity(text)
    except ValueError:
        return False
    return True


def _parse_decimal(number: str) -> Fraction:
    whole, _, frac = number.partition(".")
    digits = (whole or "0") + frac
    return Fraction(int(digits), 10 ** len(frac))


_SUFFIX_SHAPE = re.compile(r"[eEinumkKMGTP]*[-+]?[0-9]*")


def _suffix_multiplier(suffix: str) -> Fraction:
    # Characters that can never be part of a suffix are a format error, as in the real parser;
    # a well-formed but unknown suffix ("KI") is a suffix error.
    if _SUFFIX_SHAPE.fullmatch(suffix) is None:
        raise ValueError(f"quantities must match the regular expression '{QUANTITY_REGEX_TEXT}'")
    if suffix in _BINARY:
        return Fraction(_BINARY[suffix])
    if suffix in _DECIMAL:
        return _DECIMAL[suffix]
    exp = _EXPONENT.fullmatch(suffix)
    if exp is None:
        raise ValueError(f"unable to parse quantity's suffix: {suffix!r}")
    power = int(exp.group(1))
    if abs(power) > _MAX_EXPONENT:
        raise ValueError("quantity exponent is out of range")
    return Fraction(10) ** power
