"""append_op and the builders on top of it: Vars of two programs are never mixed."""
from __future__ import annotations

import pytest

import retrograd as rg


def _var_of_another_program(shape=(3, 2, 2)):
    with rg.program_guard(rg.Program(), rg.Program()):
        return rg.data("a", list(shape), dtype="float64")


@pytest.mark.parametrize("build", [
    lambda a, b: a + b,
    lambda a, b: rg.cond(rg.sum(b) > 0.0, lambda: a * 2.0, lambda: b),
    lambda a, b: rg.while_loop(lambda i, v: i < 3, lambda i, v: [i + 1, v * 2.0],
                               [rg.constant(0, dtype="int64"), a]),
    lambda a, b: rg.recurrent(lambda xs, hs: [xs[0] + hs[0]], [a], [rg.data("h0", [2, 2], dtype="float64")]),
    lambda a, b: rg.layers.lstm(a, 3),
], ids=["add", "cond", "while_loop", "recurrent", "lstm"])
def test_vars_of_two_programs_are_a_program_error_naming_the_other_program(build):
    """Regression (issue #10): the message said 'belongs to block 0, which block 0 cannot see'."""
    a = _var_of_another_program()
    with rg.program_guard(rg.Program(), rg.Program()):
        b = rg.data("b", [3, 2, 2], dtype="float64")
        with pytest.raises(rg.ProgramError, match="'a' belongs to block 0 of another program"):
            build(a, b)


