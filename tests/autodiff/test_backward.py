"""build_backward / gradients / append_backward: regression tests for sub-block gradients
(issue #10, bugs 1 and 2), checked against PyTorch."""
from __future__ import annotations

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the reference values come from PyTorch (pip install torch)")

import retrograd as rg
from retrograd.testing import build_program as build, started_executor as executor

F64 = "float64"
P0 = np.array([0.5, -1.25, 2.0])


def _torch_grad(fn, p0=P0):
    p = torch.tensor(p0, dtype=torch.float64, requires_grad=True)
    g, = torch.autograd.grad(fn(p).sum(), p)
    return g.numpy()


def _run(main, startup, fetch, **feed):
    return executor(startup).run(main, feed=feed, fetch_list=list(fetch))


# --- Bug 1: rg.gradients inside a sub-block, of an input reached through enclosing ops ----------

def test_gradients_in_cond_branch_reach_input_through_enclosing_ops():
    """q = p * p in block 0; inside a branch, d(3q)/dp = 6p (was None)."""
    def model():
        p = rg.data("p", [3], dtype=F64, stop_gradient=False)
        q = p * p
        flag = rg.data("flag", [], dtype="bool")
        return rg.cond(flag, lambda: rg.gradients(q * 3.0, p)[0], lambda: p * 0.0)
    main, startup, out = build(model)
    got, = _run(main, startup, [out], p=P0, flag=np.array(True))
    np.testing.assert_allclose(got, _torch_grad(lambda p: 3.0 * p * p), rtol=1e-12)


def test_gradients_in_while_body_call_grad_in_loop():
    """TensorFlow's testCallGradInLoop: x += d(data * p^2)/dp ten times = 10 * 2p * sum(data)."""
    def model():
        p = rg.data("p", [], dtype=F64, stop_gradient=False)
        p1 = rg.square(p)

        def body(i, x):
            data = rg.constant(np.array([1.0, 2.0, 3.0])) * p1
            return i + 1, x + rg.gradients(data, p)[0]
        return rg.while_loop(lambda i, x: i < 10, body, [rg.constant(0), rg.constant(0.0, dtype=F64)])[1]
    main, startup, out = build(model)
    got, = _run(main, startup, [out], p=np.array(5.0))
    ref = 10 * _torch_grad(lambda p: torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64) * p * p, np.array(5.0))
    np.testing.assert_allclose(got, ref, rtol=1e-12)
    assert float(got) == 600.0


def test_gradients_in_nested_branch_sum_direct_and_enclosing_paths():
    """Inside a Do inside a branch, p is read directly, through the Do's input and
    through an op two levels up; the gradient sums all three paths."""
    def model():
        p = rg.data("p", [3], dtype=F64, stop_gradient=False)
        q = rg.tanh(p) * p                                   # block 0
        flag = rg.data("flag", [], dtype="bool")

        def branch():
            r = q * q                                        # the branch
            return rg.do(lambda a: rg.gradients(a * r + p * p * p, p)[0], rg.exp(p))
        return rg.cond(flag, branch, lambda: p)
    main, startup, out = build(model)
    got, = _run(main, startup, [out], p=P0, flag=np.array(True))
    # rg.exp(p) enters the Do as a bound input, so (as in TF) its path is a leaf there: a is constant.
    a = torch.tensor(np.exp(P0))
    ref = _torch_grad(lambda p: a * (torch.tanh(p) * p) ** 2 + p ** 3)
    np.testing.assert_allclose(got, ref, rtol=1e-12)


def test_gradients_inside_branch_of_inputs_declared_there_are_unchanged():
    def model():
        p = rg.data("p", [3], dtype=F64, stop_gradient=False)

        def branch():
            s = rg.tanh(p) + 0.0
            return rg.gradients(rg.sum(s * s), s)[0]
        return rg.cond(rg.constant(True), branch, lambda: p)
    main, startup, out = build(model)
    got, = _run(main, startup, [out], p=P0)
    np.testing.assert_allclose(got, 2 * np.tanh(P0), rtol=1e-12)


# --- Bug 2: append_backward callbacks reach the gradient ops of sub-block backward blocks -------

def _sub_block_model():
    x = rg.data("x", [2, 3], dtype=F64, stop_gradient=False)
    w = rg.create_parameter("w", [3, 3], dtype=F64, init=np.eye(3) * 0.5)
    y = rg.cond(rg.sum(x) > 0.0, lambda: rg.tanh(x @ w), lambda: x * 2.0)
    y = rg.while_loop(lambda i, h: i < 2, lambda i, h: (i + 1, rg.tanh(h @ w)), [rg.constant(0), y])[1]
    y = rg.do(lambda a: a * a @ w, y)
    (hs,), _ = rg.recurrent(lambda xs, hs: [rg.tanh(xs[0] @ w + hs[0])], [rg.unsqueeze(y, [0])],
                            [rg.zeros_like(x)])
    return rg.mean(hs)


def test_append_backward_callbacks_reach_sub_block_gradient_ops():
    seen = []

    def callback(block, context):
        seen.append((block.idx, id(context["__current_op__"])))

    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        loss = _sub_block_model()
        n_forward = len(main.global_block().ops)
        rg.append_backward(loss, callbacks=[callback])
    grad_ops = main.global_block().ops[n_forward:]
    backward_blocks = [sub for op in grad_ops for sub in op.sub_blocks()]
    kinds = {op.type for op in grad_ops if op.sub_blocks()}
    assert {"If", "Scan", "Do", "RecurrentNetworkGrad"} <= kinds
    reported = {op_id for _, op_id in seen}
    for block in backward_blocks:
        made = [op for op in block.ops if op.inputs]     # recomputed constants read nothing
        assert all(id(op) in reported for op in made), f"block {block.idx}"
    assert sum(1 for block in backward_blocks for op in block.ops if id(op) in reported) >= 10


def test_callbacks_clip_gradients_inside_a_loop_like_paddle_error_clip():
    """PaddlePaddle's error clipping: a callback appends an in-place Clip after the gradient op of a
    marked value; the value lives in a while body, so only sub-block callbacks can clip it. The
    gradients equal PyTorch's with a clamping hook on that value in every iteration."""
    w0 = np.array([[0.9, -0.4, 0.3], [0.2, 1.1, -0.5], [-0.7, 0.6, 0.8]])
    x0 = np.array([0.8, -0.3, 0.5])
    marked = []

    def clip_marked(block, context):
        op = context["__current_op__"]
        for name in op.outputs:
            if any(context.get(name) is var for var in marked):
                block.append_op(rg.ir.Op("Clip", [name], [name], {"lo": -0.05, "hi": 0.05}))

    def body(i, h):
        t = rg.reshape(rg.reshape(h, [1, 3]) @ w, [3])
        marked.append(t)
        return i + 1, rg.tanh(t) * 1.5

    main, startup = rg.Program(), rg.Program()
    with rg.program_guard(main, startup):
        x = rg.data("x", [3], dtype=F64)
        w = rg.create_parameter("w", [3, 3], dtype=F64, init=w0)
        h = rg.while_loop(lambda i, h: i < 3, body, [rg.constant(0), x])[1]
        (_, dw), = rg.append_backward(rg.sum(h * h), callbacks=clip_marked)
    got, = _run(main, startup, [dw], x=x0)

    wt = torch.tensor(w0, requires_grad=True)
    ht = torch.tensor(x0)
    for _ in range(3):
        t = ht @ wt
        t.register_hook(lambda g: g.clamp(-0.05, 0.05))
        ht = torch.tanh(t) * 1.5
    ref, = torch.autograd.grad((ht * ht).sum(), wt)
    np.testing.assert_allclose(got, ref.numpy(), rtol=1e-12)
    ht = torch.tensor(x0)
    for _ in range(3):
        ht = torch.tanh(ht @ wt) * 1.5
    unclipped, = torch.autograd.grad((ht * ht).sum(), wt)
    assert np.abs(unclipped.numpy() - got).max() > 0.1       # the clip did something
