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


# --- the rule (issue 30): deliberate infinities pass, made ones stop -----------------------------

def _masked_softmax_model(mask_kind: str):
    """Attention scores masked to -inf (a fill_like, or a fed additive mask), softmax, a loss and
    its backward: everything finite but the mask."""
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [2, 4])
        w = rg.create_parameter("w", [4, 4], init=0.5)
        scores = x @ w
        if mask_kind == "fill_like":
            keep = rg.data("keep", [2, 4], "bool")
            scores = rg.where(keep, scores, rg.fill_like(scores, -np.inf))
        else:
            scores = scores + rg.data("mask", [2, 4])
        probs = rg.softmax(scores, axis=-1)
        loss = rg.mean(probs * probs)
        rg.optim.SGD(0.1).minimize(loss)
    return main, startup, loss, probs


KEEP = np.array([[True, True, False, False], [True, False, True, True]])


@pytest.mark.parametrize("mask_kind", ["fill_like", "additive"])
def test_check_finite_passes_minus_inf_attention_masks(backend, mask_kind):
    main, startup, loss, probs = _masked_softmax_model(mask_kind)
    feed = {"x": XB}
    if mask_kind == "fill_like":
        feed["keep"] = KEEP
    else:
        feed["mask"] = np.where(KEEP, 0.0, -np.inf).astype("float32")
    checked, plain = rg.Executor(**backend.kwargs, check_finite=True), rg.Executor(**backend.kwargs)
    for exe in (checked, plain):
        exe.run(startup)
    got = checked.run(main, feed=feed, fetch_list=[loss, probs])
    want = plain.run(main, feed=feed, fetch_list=[loss, probs])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)
    scores = XB @ np.full((4, 4), 0.5, "float32")
    e = np.where(KEEP, np.exp(scores - scores.max(axis=1, keepdims=True)), 0.0)
    np.testing.assert_allclose(got[1], e / e.sum(axis=1, keepdims=True), rtol=1e-5)


def test_check_finite_passes_scaled_dot_product_attention_with_minus_inf_mask(backend):
    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        q = rg.data("q", [1, 3, 4])
        w = rg.create_parameter("w", [4, 4], init=0.1)
        mask = rg.data("mask", [3, 3])
        out = rg.scaled_dot_product_attention(q @ w, q, q, mask=mask)
        loss = rg.mean(out * out)
        rg.optim.SGD(0.1).minimize(loss)
    exe = rg.Executor(**backend.kwargs, check_finite=True)
    exe.run(startup)
    mask_v = np.triu(np.full((3, 3), -np.inf, "float32"), k=1)        # causal, as a -inf mask
    qv = np.arange(12, dtype="float32").reshape(1, 3, 4) / 10
    got, = exe.run(main, feed={"q": qv, "mask": mask_v}, fetch_list=[loss])
    assert np.isfinite(got)


def test_check_finite_passes_top_k_sampling(backend):
    from retrograd.models.generation import draw
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        logits = rg.data("logits", [2, 5])
        ids = draw(logits, rg.constant(0.8), rg.constant(2, "int64"), rg.constant(7, "int64"))
    logits_v = np.array([[0.0, 3.0, 1.0, 2.5, -1.0], [5.0, 0.0, 4.0, 0.0, 0.0]], "float32")
    got, = rg.Executor(**backend.kwargs, check_finite=True).run(main, feed={"logits": logits_v},
                                                              fetch_list=[ids])
    assert got[0] in (1, 3) and got[1] in (0, 2)             # only the top 2 of each row


def test_check_finite_passes_fills_and_constants_of_inf(backend):
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [3])
        low = rg.fill([3], -np.inf)
        high = rg.constant([np.inf, 1.0, 2.0])
        out = rg.maximum(x, low) + high
    got, = rg.Executor(**backend.kwargs, check_finite=True).run(
        main, feed={"x": np.array([1.0, 2.0, 3.0], "float32")}, fetch_list=[out])
    np.testing.assert_array_equal(got, [np.inf, 3.0, 5.0])


def _one_op_program(make):
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        x = rg.data("x", [3])
        out = make(x) if make is not rg.div else make(x, x)         # MADE LINE
    return main, out


@pytest.mark.parametrize("case, op, kind, value", [
    ("exp_overflow", rg.exp, "Exp.* produced Inf", [1.0, 100.0, 2.0]),
    ("zero_over_zero", rg.div, "Div.* produced NaN", [1.0, 0.0, 2.0]),
    ("log_of_negative", rg.log, "Log.* produced NaN", [1.0, -2.0, 2.0]),
    ("log_of_zero", rg.log, "Log.* produced Inf", [1.0, 0.0, 2.0]),
])
def test_check_finite_still_stops_at_a_real_overflow_or_nan(backend, case, op, kind, value):
    main, out = _one_op_program(op)
    exe = rg.Executor(**backend.kwargs, check_finite=True)
    with np.errstate(all="ignore"), pytest.raises(rg.ExecutionError) as info:
        exe.run(main, feed={"x": np.array(value, "float32")}, fetch_list=[out])
    message = str(info.value)
    assert f"test_finite.py:{_line_of('# MADE LINE')}:" in message, message
    assert re.search(kind, message), message


def test_check_finite_stops_at_inf_minus_inf_even_with_inf_inputs(backend):
    main, out = _one_op_program(lambda x: x - x)          # inf - inf = NaN: an infinity in, a NaN made
    with np.errstate(all="ignore"), pytest.raises(rg.ExecutionError, match=r"produced NaN"):
        rg.Executor(**backend.kwargs, check_finite=True).run(
            main, feed={"x": np.array([1.0, np.inf, 2.0], "float32")}, fetch_list=[out])


def test_check_finite_sampler_ops_name_generation_py_not_the_installed_script():
    # the sampler's ops are built in retrograd/generation.py: an error names that line, not the
    # installed `retrograd` script that called it
    from retrograd.models.generation import draw
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        logits = rg.data("logits", [1, 3])
        draw(logits, rg.constant(0.8), rg.constant(0, "int64"), rg.constant(1, "int64"))
    locations = {op.location for op in main.global_block().ops if op.type == "FillLike"}
    assert locations and all("generation.py:" in loc for loc in locations), locations


def test_check_finite_passes_a_fetched_minus_inf_mask(backend):
    # the onnxruntime engine sees only the graph's outputs: a fetched -inf sends it to re-run the
    # program on NumPy, which makes the same -inf without complaint, so the run goes on
    main = rg.Program()
    with rg.program_guard(main, rg.Program()):
        scores = rg.data("scores", [2, 2])
        keep = rg.data("keep", [2, 2], "bool")
        masked = rg.where(keep, scores * 2.0, rg.fill_like(scores, -np.inf))
    feed = {"scores": np.ones((2, 2), "float32"), "keep": np.array([[True, False], [False, True]])}
    got, = rg.Executor(**backend.kwargs, check_finite=True).run(main, feed=feed, fetch_list=[masked])
    np.testing.assert_array_equal(got, [[2.0, -np.inf], [-np.inf, 2.0]])
