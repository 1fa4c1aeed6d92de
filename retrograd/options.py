"""Parsers for command-line option values (argparse ``type=`` functions) shared by the commands.

Example::

    parser.add_argument("--recompute", type=parse_recompute)   # none | steps | 96K
    parser.add_argument("--steps", type=positive(int))
"""
from __future__ import annotations

import argparse
import math
import re

_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}


def byte_size(text: str) -> int:
    """A byte count: ``65536``, ``96K``, ``8M``, ``1G`` (binary multiples; a trailing ``B`` is fine)."""
    match = re.fullmatch(r"(\d+)\s*([kmg]?)(?:i?b)?", text.strip().lower())
    if not match:
        raise argparse.ArgumentTypeError(f"'{text}' is not a byte size like 65536, 96K, 8M or 1G")
    return int(match.group(1)) * _UNITS[match.group(2)]


def parse_recompute(text: str):
    """``none`` -> None, ``steps`` -> "steps", a byte budget (``65536``, ``96K``, ``8M``, ``1G``) -> int."""
    word = text.strip().lower()
    if word in ("none", "steps"):
        return None if word == "none" else "steps"
    try:
        return byte_size(word)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"'{text}' is not none, steps or a byte budget like 96K or 64M") \
            from None


# What a value of the kind is called in messages, and a positive one.
_KIND_NAMES = {int: ("an integer", "a positive integer"), float: ("a number", "a positive number")}


def positive(kind):
    """A parser of positive ``kind`` values (``int`` or ``float``; floats must be finite).

    Example::

        parser.add_argument("--steps", type=positive(int))   # "--steps ten": 'ten' is not an integer
    """
    name, positive_name = _KIND_NAMES[kind]

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not {name}") from None
        if not value > 0 or (kind is float and not math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be {positive_name}, got {text}")
        return value
    parse.__name__ = positive_name
    return parse


def non_negative(text: str) -> float:
    """A finite float >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return int(text)
