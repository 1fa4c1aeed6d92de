"""Program, Block, Var: integers where integers belong, checked where they enter the IR."""
from __future__ import annotations

import numpy as np
import pytest

import retrograd as rg
from retrograd.errors import ProgramError
from retrograd.ir.program import Program, as_float, as_int, as_ints


@pytest.mark.parametrize("value, expected", [(3, 3), (np.int64(-1), -1), (2.0, 2), (np.float32(4.0), 4)])
def test_as_int_takes_ints_and_integral_floats(value, expected):
    assert as_int(value, "x") == expected and type(as_int(value, "x")) is int


@pytest.mark.parametrize("value", [1.5, float("nan"), float("inf"), "1", None, True, np.bool_(True), [1]])
def test_as_int_refuses_what_int_would_truncate_parse_or_crash_on(value):
    with pytest.raises(ProgramError, match="the thing must be an integer"):
        as_int(value, "the thing")


def test_as_ints_and_as_float_refuse_non_lists_and_non_numbers():
    assert as_ints((1, np.int32(2), 3.0), "dims") == [1, 2, 3]
    for bad in (None, 3, "12"):
        with pytest.raises(ProgramError, match="dims must be a list"):
            as_ints(bad, "dims")
    assert as_float(np.float32(0.5), "lo") == 0.5
    with pytest.raises(ProgramError, match="lo must be a number"):
        as_float("0.5", "lo")


@pytest.mark.parametrize("build", [
    lambda x: rg.data("z", [1.5]),
    lambda x: rg.data("z", ["a"]),
    lambda x: rg.data("z", [float("nan")]),
    lambda x: rg.data("z", None),
    lambda x: rg.reshape(x, [2.5, 2]),
    lambda x: rg.reshape(x, ["a"]),
    lambda x: rg.sum(x, axis=1.5),
    lambda x: rg.mean(x, axis="1"),
    lambda x: rg.slice(x, [0], [0.5], [1]),
    lambda x: rg.split(x, 1.5, axis=1),
    lambda x: rg.transpose(x, [1.5, 0]),
    lambda x: rg.concat([x, x], axis=None),
    lambda x: rg.softmax(x, axis="last"),
    lambda x: rg.fill([2.5], 0.0),
    lambda x: rg.clip(x, "a", 1.0),
    lambda x: rg.constant([[1, 2], [3]]),
], ids=["data float", "data str", "data nan", "data None", "reshape float", "reshape str", "sum axis float",
        "mean axis str", "slice start float", "split float", "transpose float", "concat axis None",
        "softmax axis str", "fill float", "clip str", "ragged constant"])
def test_non_integer_sizes_and_axes_from_the_api_are_program_errors(build):
    """Regression (issue #10): these truncated silently (1.5 -> 1) or escaped as ValueError/TypeError."""
    with rg.program_guard(Program(), Program()):
        x = rg.data("x", [2, 3], dtype="float64")
        with pytest.raises(ProgramError):
            build(x)


def test_integral_floats_are_accepted_as_sizes():
    with rg.program_guard(Program(), Program()):
        x = rg.data("x", [2.0, np.int64(3)])
        assert x.shape == (2, 3) and rg.reshape(x, [3.0, 2]).shape == (3, 2)
