"""``rg.Executor(check_finite=True)``: the first op whose output holds NaN or Inf is named, with its
inputs and the user's line, on every backend (the onnxruntime engine finds it by re-running the
program on NumPy); off by default."""
from __future__ import annotations

import re

import numpy as np
import pytest

import retrograd as rg
from retrograd.backends import to_numpy

pytestmark = pytest.mark.engine

XB = np.array([[1.0, 2.0, -3.0, 0.5], [0.25, -1.0, 2.0, 1.0]], dtype="float32")


def _log_model():
    """``log(x @ w)`` with w = 1: row sums 0.5 and 2.25 -> log(0.5) fine; a negative row sum NaN."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 4])
        w = rg.create_parameter("w", [4, 2], init=1.0)
        h = rg.log(x @ w)                                               # LOG LINE
        loss = rg.mean(h * h)
        rg.optim.SGD(0.1).minimize(loss)
    return main, startup, loss


def _line_of(marker: str) -> int:
    lines = open(__file__, encoding="utf-8").read().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.rstrip().endswith(marker))


def test_check_finite_names_the_first_op_whose_output_is_nan(backend):
    main, startup, loss = _log_model()
    exe = rg.Executor(**backend.kwargs, check_finite=True)
    exe.run(startup)
    w_before = to_numpy(exe.scope.get("w")).copy()
    xb = XB.copy()
    xb[1] = [-1.0, -1.0, -1.0, 0.5]                      # row sum -2.5: log of a negative number
    with np.errstate(invalid="ignore"), pytest.raises(rg.ExecutionError) as info:
        exe.run(main, feed={"x": xb}, fetch_list=[loss])
    message = str(info.value)
    assert re.search(rf"test_finite.py:{_line_of('# LOG LINE')}: op #\d+ Log in block 0 produced NaN "
                     r"in its output 'log_\d+' \(2 NaN, 0 Inf of 4 values; inputs: matmul_\d+: "
                     r"float32\[2, 2\] min -2.5 max 0.5, finite\)", message), message
    np.testing.assert_array_equal(to_numpy(exe.scope.get("w")), w_before)    # no update was stored


def test_check_finite_finds_inf_in_a_gradient_op_at_the_forward_line(backend):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [-1, 2])
        w = rg.create_parameter("w", [2], init=0.0)
        loss = rg.sum(rg.sqrt(x * w))                                   # SQRT LINE
        rg.optim.SGD(0.1).minimize(loss)              # d sqrt(u)/du at u = 0 is Inf
    exe = rg.Executor(**backend.kwargs, check_finite=True)
    exe.run(startup)
    with np.errstate(divide="ignore", invalid="ignore"), pytest.raises(rg.ExecutionError) as info:
        exe.run(main, feed={"x": np.ones((3, 2), "float32")}, fetch_list=[loss])
    message = str(info.value)
    assert f"test_finite.py:{_line_of('# SQRT LINE')}:" in message, message
    assert re.search(r"produced (Inf|NaN)", message) and "inputs:" in message, message


def test_check_finite_inside_a_loop_body_names_the_inner_op(backend):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [3])
        i0 = rg.fill([1], 0, "int64")
        _, out = rg.while_loop(lambda i, v: rg.less(i, rg.fill([1], 3, "int64")),
                               lambda i, v: (i + 1, rg.exp(v * 40.0)),           # EXP LINE
                               [i0, x])
    exe = rg.Executor(**backend.kwargs, check_finite=True)
    with np.errstate(over="ignore"), pytest.raises(rg.ExecutionError) as info:
        exe.run(main, feed={"x": np.array([0.0, 0.1, 0.05], "float32")}, fetch_list=[out])
    message = str(info.value)
    assert f"test_finite.py:{_line_of('# EXP LINE')}:" in message, message
    assert re.search(r"Exp in block \d+ produced Inf", message), message


def test_check_finite_is_off_by_default_and_silent_on_finite_runs(backend):
    main, startup, loss = _log_model()
    plain = rg.Executor(**backend.kwargs)
    plain.run(startup)
    xb = XB.copy()
    xb[1] = -1.0
    with np.errstate(invalid="ignore"):
        got, = plain.run(main, feed={"x": xb}, fetch_list=[loss])
    assert np.isnan(got)
    checked = rg.Executor(**backend.kwargs, check_finite=True)
    unchecked = rg.Executor(**backend.kwargs)
    for exe in (checked, unchecked):
        exe.run(startup)
    for _ in range(3):
        a, = checked.run(main, feed={"x": XB}, fetch_list=[loss])
        b, = unchecked.run(main, feed={"x": XB}, fetch_list=[loss])
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(to_numpy(checked.scope.get("w")), to_numpy(unchecked.scope.get("w")))


def test_check_finite_leaves_integer_outputs_alone():
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        ids = rg.data("ids", [3], "int64")
        big = ids * 2
    got, = rg.Executor(check_finite=True).run(main, feed={"ids": np.array([1, 2, 3])}, fetch_list=[big])
    np.testing.assert_array_equal(got, [2, 4, 6])
