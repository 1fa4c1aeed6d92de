"""Parsers of command-line option values (retrograd/options.py)."""
from __future__ import annotations

import argparse

import pytest

from retrograd.options import byte_size, non_negative, positive


@pytest.mark.parametrize("kind, text, message", [
    (int, "ten", "'ten' is not an integer"),
    (int, "1.5", "'1.5' is not an integer"),
    (int, "0", "must be a positive integer, got 0"),
    (float, "x", "'x' is not a number"),
    (float, "-1", "must be a positive number, got -1"),
    (float, "inf", "must be a positive number, got inf"),
])
def test_argparse_says_an_integer_not_a_int(kind, text, message):
    """Issue 23: "--steps ten" said "'ten' is not a int"."""
    with pytest.raises(argparse.ArgumentTypeError) as info:
        positive(kind)(text)
    assert str(info.value) == message


def test_positive_values_parse():
    assert positive(int)("12") == 12 and positive(float)("3e-3") == 3e-3


def test_byte_sizes_and_non_negative_numbers():
    assert byte_size("96K") == 96 * 1024 and non_negative("0") == 0.0
    with pytest.raises(argparse.ArgumentTypeError, match="not a number"):
        non_negative("a")
